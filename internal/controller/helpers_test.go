package controller

import (
	"context"
	"path/filepath"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/filestore"
	"github.com/spindle-csi/spindle/internal/backend/loop"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/kms"
	"github.com/spindle-csi/spindle/internal/oplock"
	"github.com/spindle-csi/spindle/internal/testutil"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// The controller side's tests run on stateful fakes and need no root: two
// loop instances (loop/default, the default, and loop/fast) whose pools are
// temporary directories and whose loop devices are in memory; the built-in
// secrets KMS. What a call leaves in the pools (images, grants, keys) is
// what is checked.

const (
	testNode   = "node-a"
	defaultKey = "loop/default"
	fastKey    = "loop/fast"
	testKEK    = "the Kubernetes Secret's value, 16+ bytes"
)

var testSecrets = map[string]string{"encryptionPassphrase": testKEK}

type env struct {
	c     *Controller
	insts backend.Instances
	pools map[string]*filestore.Store
	locks *oplock.Locks
	// ctx carries the request's secrets, as the driver's interceptor puts
	// them there.
	ctx context.Context
}

// newEnv builds the controller side of node testNode over loop/default and
// loop/fast; change adjusts the instances before the controller is built.
func newEnv(t *testing.T, change ...func(backend.Instances)) *env {
	t.Helper()
	e := &env{insts: backend.Instances{}, pools: map[string]*filestore.Store{}, locks: oplock.New(),
		ctx: backend.WithSecrets(t.Context(), testSecrets)}
	for _, name := range []string{"default", "fast"} {
		inst, err := loop.NewWithLoopDevices(name, loop.Config{PoolDir: filepath.Join(t.TempDir(), "pool-"+name)}, blockdev.NewFakeLoopDevices())
		if err != nil {
			t.Fatal(err)
		}
		e.insts[inst.Key()] = inst
		e.pools[inst.Key()] = inst.Store.(*filestore.Store)
		for _, n := range []string{"node-a", "node-b"} {
			if err := inst.Attacher.RegisterNode(t.Context(), backend.NodeInfo{NodeID: n}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, f := range change {
		f(e.insts)
	}
	registry, err := kms.Load("")
	if err != nil {
		t.Fatal(err)
	}
	e.c = New(Options{Instances: e.insts, DefaultInstance: defaultKey, NodeID: testNode, KMS: registry, Locks: e.locks, Log: zaptest.NewLogger(t)})
	return e
}

var (
	mountRW = Capability{Access: backend.AccessMount, Mode: backend.SingleNodeWriter, FsType: "ext4"}
	blockRW = Capability{Access: backend.AccessBlock, Mode: backend.SingleNodeWriter}
)

// createReq is a valid request: an ext4 single-node writer of 8 MiB.
func createReq(name string) CreateRequest {
	return CreateRequest{Name: name, Capabilities: []Capability{mountRW}, RequiredBytes: 8 * mib}
}

func (e *env) mustCreate(t *testing.T, r CreateRequest) *Volume {
	t.Helper()
	v, err := e.c.CreateVolume(e.ctx, r)
	if err != nil {
		t.Fatalf("CreateVolume(%s): %v", r.Name, err)
	}
	return v
}

func mustID(t *testing.T, s string) volumeid.ID {
	t.Helper()
	id, err := volumeid.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// image reads a volume's record from its pool.
func (e *env) image(t *testing.T, volumeID string) *backend.Image {
	t.Helper()
	id := mustID(t, volumeID)
	img, err := e.pools[id.InstanceKey()].Get(context.Background(), id.Image)
	if err != nil {
		t.Fatalf("image of %s: %v", volumeID, err)
	}
	return img
}

// noImage fails unless the volume is gone from its pool.
func (e *env) noImage(t *testing.T, volumeID string) {
	t.Helper()
	id := mustID(t, volumeID)
	_, err := e.pools[id.InstanceKey()].Get(context.Background(), id.Image)
	testutil.WantKind(t, err, errdefs.ErrNotFound)
}

// wantKind fails unless err is of kind (nil: no error) and names every one
// of mentions.
func wantKind(t *testing.T, err, kind error, mentions ...string) {
	t.Helper()
	if kind == nil {
		if err != nil {
			t.Fatalf("error %v, want none", err)
		}
		return
	}
	testutil.WantKind(t, err, kind, mentions...)
}

// withStatic makes loop/fast's store one that also serves pre-provisioned
// volumes and adopts images, as the rbd store does with ceph-csi's: it
// claims clusterID "rook-ceph", takes clusterID and pool, and names an
// image of its pool by the handle (or imageName).
func withStatic(openBy ...string) func(backend.Instances) {
	return func(insts backend.Instances) {
		inst := insts[fastKey]
		inst.Store = staticStore{Store: inst.Store.(*filestore.Store), openBy: openBy}
	}
}

type staticStore struct {
	*filestore.Store
	openBy []string // the clients that have every image open
}

func (staticStore) Claims(p map[string]string) bool { return p["clusterID"] == "rook-ceph" }

func (staticStore) CheckVolumeParameters(p map[string]string) error {
	for k := range p {
		if k != "clusterID" && k != "pool" {
			return errdefs.InvalidArgument("parameters: unknown key %q", k)
		}
	}
	return nil
}

func (staticStore) CheckSnapshotParameters(_ string, p map[string]string) error {
	for k := range p {
		if k != "clusterID" {
			return errdefs.InvalidArgument("parameters: unknown key %q", k)
		}
	}
	return nil
}

func (staticStore) StaticImage(handle string, attrs map[string]string) (string, error) {
	if attrs["pool"] == "" {
		return "", errdefs.InvalidArgument("volumeAttributes.pool is required")
	}
	if v := attrs["imageName"]; v != "" {
		return v, nil
	}
	return handle, nil
}

func (staticStore) StaticPublishContext(imageID string, _ map[string]string) (map[string]string, error) {
	return map[string]string{"image": imageID}, nil
}

func (staticStore) StaticAttacher() backend.Attacher { return nil }

func (s staticStore) Adopt(ctx context.Context, spec backend.AdoptSpec) (*backend.Adopted, error) {
	img, err := s.Get(ctx, spec.ImageID)
	if err != nil {
		return nil, err
	}
	if len(s.openBy) > 0 && !spec.DryRun {
		return nil, errdefs.Precondition("adopt %s: the image is still open by %v", spec.ImageID, s.openBy)
	}
	img.Name, img.Parameters, img.AccessType, img.FsType = spec.Name, spec.Parameters, spec.AccessType, spec.FsType
	if spec.DryRun {
		return &backend.Adopted{Image: img, OpenBy: s.openBy}, nil
	}
	return &backend.Adopted{Image: img}, nil
}
