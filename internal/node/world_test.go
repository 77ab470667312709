package node

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/filestore"
	"github.com/spindle-csi/spindle/internal/backend/loop"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// world is a node on an in-memory host: the loop backend over a pool in a
// temporary directory and fake loop devices, whose devices are the host's.
// Nothing in it needs root.
type world struct {
	t     *testing.T
	host  *FakeHost
	loops *blockdev.FakeLoopDevices
	inst  *backend.Instance
	pool  *filestore.Store
	v     *Volumes
	// kubelet is kubelet's directory on the fake host.
	kubelet string
}

const worldNode = "node-a"

func newWorld(t *testing.T) *world {
	t.Helper()
	loops := blockdev.NewFakeLoopDevices()
	inst, err := loop.NewWithLoopDevices("default", loop.Config{PoolDir: t.TempDir()}, loops)
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Attacher.RegisterNode(context.Background(), backend.NodeInfo{NodeID: worldNode}); err != nil {
		t.Fatal(err)
	}
	host := NewFakeHost()
	host.UseLoopDevices(loops)
	w := &world{t: t, host: host, loops: loops, inst: inst, pool: inst.Store.(*filestore.Store), kubelet: "/var/lib/kubelet"}
	w.v, err = New(host, Options{
		NodeID: worldNode, PathRoots: []string{w.kubelet}, StageRecordsRoot: w.kubelet + "/plugins/kubernetes.io/csi",
		OwnerOf: w.ownerOf, Log: zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// ownerOf is what the driver answers: the volume whose image a device is bound to.
func (w *world) ownerOf(ctx context.Context, dev string) string {
	d, err := w.loops.Get(ctx, dev)
	if err != nil {
		return ""
	}
	if id, ok := w.pool.ImageIDOf(d.BackingFile); ok {
		return "loop/default/" + id
	}
	return ""
}

// testVolume is a volume created and published to this node.
type testVolume struct {
	Volume
	pc      map[string]string
	access  backend.AccessType
	staging string
	target  string
}

func (w *world) newVolume(name string, access backend.AccessType, mode backend.AccessMode, readOnly bool) *testVolume {
	w.t.Helper()
	ctx := context.Background()
	spec := backend.VolumeSpec{Name: name, CapacityBytes: 64 * mib, AccessType: access}
	if access == backend.AccessMount {
		spec.FsType = "ext4"
	}
	img, err := w.inst.Store.Create(ctx, spec)
	if err != nil {
		w.t.Fatal(err)
	}
	pc, err := w.inst.Exporter.Publish(ctx, img.ID, backend.Attachment{NodeID: worldNode, AccessMode: mode, ReadOnly: readOnly})
	if err != nil {
		w.t.Fatal(err)
	}
	staging := filepath.Join(w.kubelet, "plugins/kubernetes.io/csi/spindle.csi.dev", name, "globalmount")
	target := filepath.Join(w.kubelet, "pods", name+"-pod", "volumes/kubernetes.io~csi", name, "mount")
	if access == backend.AccessBlock {
		staging = filepath.Join(w.kubelet, "plugins/kubernetes.io/csi/volumeDevices/staging", name)
		target = filepath.Join(w.kubelet, "plugins/kubernetes.io/csi/volumeDevices/publish", name, name+"-pod")
	}
	return &testVolume{
		Volume: Volume{ID: "loop/default/" + img.ID, Image: img.ID, Attacher: w.inst.Attacher},
		pc:     pc, access: access, staging: staging, target: target,
	}
}

func (w *world) stageReq(tv *testVolume) StageRequest {
	return StageRequest{Volume: tv.Volume, StagingPath: tv.staging, Access: tv.access, Mode: backend.SingleNodeWriter, PublishContext: tv.pc}
}

func (w *world) publishReq(tv *testVolume, target string, readOnly bool) PublishRequest {
	return PublishRequest{Volume: tv.Volume, StagingPath: tv.staging, TargetPath: target, Access: tv.access,
		Mode: backend.SingleNodeWriter, ReadOnly: readOnly, PublishContext: tv.pc}
}

func (w *world) mustStage(tv *testVolume) {
	w.t.Helper()
	if err := w.v.Stage(context.Background(), w.stageReq(tv)); err != nil {
		w.t.Fatalf("Stage(%s): %v", tv.ID, err)
	}
}

func (w *world) mustPublish(tv *testVolume, target string, readOnly bool) {
	w.t.Helper()
	if err := w.v.Publish(context.Background(), w.publishReq(tv, target, readOnly)); err != nil {
		w.t.Fatalf("Publish(%s, %s): %v", tv.ID, target, err)
	}
}

// state is everything of the node a request can change, for before/after
// comparisons: the mount table, the attached devices and the stage records.
type state struct {
	mounts  []string
	devices []string
	records []string
}

func (w *world) state() state {
	w.t.Helper()
	var s state
	for _, m := range w.host.MountTable() {
		s.mounts = append(s.mounts, m.MountPoint+" <- "+m.Source+" "+strings.Join(m.Options, ","))
	}
	for dev, d := range w.loops.Devices {
		s.devices = append(s.devices, dev+" -> "+filepath.Base(d.BackingFile))
	}
	slices.Sort(s.devices)
	recs, err := w.host.StageRecords(w.kubelet, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	for _, r := range recs {
		s.records = append(s.records, r.StagingPath+" = "+r.Record.VolumeID+" on "+r.Record.Device)
	}
	return s
}

func (s state) equal(o state) bool {
	return slices.Equal(s.mounts, o.mounts) && slices.Equal(s.devices, o.devices) && slices.Equal(s.records, o.records)
}

// wantKind fails unless err is of kind with a message holding every one of
// substrs.
func wantKind(t *testing.T, err, kind error, substrs ...string) {
	t.Helper()
	if kind == nil {
		if err != nil {
			t.Fatalf("error %v, want none", err)
		}
		return
	}
	if !errors.Is(err, kind) {
		t.Fatalf("error %v, want kind %v", err, kind)
	}
	for _, s := range substrs {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not contain %q", err, s)
		}
	}
}

var (
	errPrecondition = errdefs.ErrPrecondition
	errNotFound     = errdefs.ErrNotFound
)
