package driver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/filestore"
	"github.com/spindle-csi/spindle/internal/backend/loop"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/config"
	"github.com/spindle-csi/spindle/internal/node"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// The tests drive the services directly through the driver's interceptor,
// so that every call sees the production error mapping and logging. The
// backends are loop instances on FakeLoopDevices with pools in temporary
// directories, and the node data path runs commands through a script that
// expects none: a test that reaches mkfs, mount or losetup fails.

const (
	testNodeID     = "node-a"
	testVersion    = "v1.2.3-test"
	testMaxVolumes = 16
	defaultKey     = "loop/default"
	fastKey        = "loop/fast"
)

// Short names for the access modes.
const (
	snw  = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	snro = csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	snsw = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	snmw = csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
	mnro = csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	mnsw = csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER
	mnmw = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
)

type testEnv struct {
	d     *Driver
	cs    *controllerService
	ns    *nodeService
	is    *identityService
	logs  *observer.ObservedLogs
	loops map[string]*blockdev.FakeLoopDevices // by instance key
	pools map[string]*filestore.Store          // by instance key
	// host is the node side's machine: an in-memory mount table, devices
	// (the fake loop devices) and kubelet's paths.
	host *node.FakeHost
	// kubelet is the driver's --kubelet-dir, a temporary directory: the
	// staging and target paths of the tests lie below it.
	kubelet string
}

// newTestEnv builds a driver serving loop/default (the default) and
// loop/fast, in mode all, as node testNodeID, unless opts say otherwise.
func newTestEnv(t *testing.T, opts ...func(*config.Options)) *testEnv {
	t.Helper()
	o := config.Options{
		Endpoint:          "unix://" + filepath.Join(t.TempDir(), "csi.sock"),
		Mode:              config.ModeAll,
		NodeID:            testNodeID,
		DriverName:        config.DefaultDriverName,
		MaxVolumesPerNode: testMaxVolumes,
		LogFormat:         "json",
		LogLevel:          "debug",
		KubeletDir:        filepath.Join(t.TempDir(), "kubelet"),
		// Tests that make their own directories use t.TempDir.
		AllowedPathRoots: []string{filepath.Dir(t.TempDir())},
	}
	for _, f := range opts {
		f(&o)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	e := &testEnv{kubelet: o.KubeletDir, logs: logs, loops: map[string]*blockdev.FakeLoopDevices{}, pools: map[string]*filestore.Store{}, host: node.NewFakeHost()}
	instances := map[string]*backend.Instance{}
	for _, name := range []string{"default", "fast"} {
		fake := blockdev.NewFakeLoopDevices()
		inst, err := loop.NewWithLoopDevices(name, loop.Config{PoolDir: filepath.Join(t.TempDir(), "pool-"+name)}, fake)
		if err != nil {
			t.Fatalf("loop instance %s: %v", name, err)
		}
		store, ok := inst.Store.(*filestore.Store)
		if !ok {
			t.Fatalf("loop instance store is %T, want *filestore.Store", inst.Store)
		}
		instances[inst.Key()] = inst
		e.loops[inst.Key()] = fake
		e.pools[inst.Key()] = store
	}
	// Both instances' fake loop devices are the host's: loop/fast's are
	// numbered from 100 so the two never share a name.
	e.loops[fastKey].Offset(100)
	e.host.UseLoopDevices(e.loops[defaultKey], e.loops[fastKey])
	d, err := newDriver(o, testVersion, instances, defaultKey, e.host, zap.New(core))
	if err != nil {
		t.Fatalf("newDriver: %v", err)
	}
	e.d = d
	e.cs = &controllerService{d: e.d}
	e.ns = &nodeService{d: e.d}
	e.is = &identityService{d: e.d}
	return e
}

// interceptor runs the chain of interceptors as one, as the gRPC server
// does (grpc.ChainUnaryInterceptor).
func (d *Driver) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	chain := d.interceptors()
	var call func(i int, ctx context.Context, req any) (any, error)
	call = func(i int, ctx context.Context, req any) (any, error) {
		if i == len(chain) {
			return handler(ctx, req)
		}
		return chain[i](ctx, req, info, func(ctx context.Context, req any) (any, error) { return call(i+1, ctx, req) })
	}
	return call(0, ctx, req)
}

// call runs h through the driver's interceptor, as the gRPC server would.
func call[Req, Resp any](e *testEnv, method string, h func(context.Context, Req) (Resp, error), req Req) (Resp, error) {
	return callCtx(context.Background(), e, method, h, req)
}

func callCtx[Req, Resp any](ctx context.Context, e *testEnv, method string, h func(context.Context, Req) (Resp, error), req Req) (Resp, error) {
	resp, err := e.d.interceptor(ctx, req, &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, r any) (any, error) {
		return h(ctx, r.(Req))
	})
	out, _ := resp.(Resp)
	return out, err
}

func (e *testEnv) CreateVolume(req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	return call(e, "/csi.v1.Controller/CreateVolume", e.cs.CreateVolume, req)
}

func (e *testEnv) DeleteVolume(volumeID string) error {
	_, err := call(e, "/csi.v1.Controller/DeleteVolume", e.cs.DeleteVolume, &csi.DeleteVolumeRequest{VolumeId: volumeID})
	return err
}

func (e *testEnv) ControllerPublish(req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	return call(e, "/csi.v1.Controller/ControllerPublishVolume", e.cs.ControllerPublishVolume, req)
}

func (e *testEnv) ControllerUnpublish(volumeID, nodeID string) error {
	_, err := call(e, "/csi.v1.Controller/ControllerUnpublishVolume", e.cs.ControllerUnpublishVolume,
		&csi.ControllerUnpublishVolumeRequest{VolumeId: volumeID, NodeId: nodeID})
	return err
}

func (e *testEnv) ValidateVolumeCapabilities(req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	return call(e, "/csi.v1.Controller/ValidateVolumeCapabilities", e.cs.ValidateVolumeCapabilities, req)
}

func (e *testEnv) NodeStage(req *csi.NodeStageVolumeRequest) error {
	_, err := call(e, "/csi.v1.Node/NodeStageVolume", e.ns.NodeStageVolume, req)
	return err
}

func (e *testEnv) NodeUnstage(req *csi.NodeUnstageVolumeRequest) error {
	_, err := call(e, "/csi.v1.Node/NodeUnstageVolume", e.ns.NodeUnstageVolume, req)
	return err
}

func (e *testEnv) NodePublish(req *csi.NodePublishVolumeRequest) error {
	_, err := call(e, "/csi.v1.Node/NodePublishVolume", e.ns.NodePublishVolume, req)
	return err
}

func (e *testEnv) NodeUnpublish(req *csi.NodeUnpublishVolumeRequest) error {
	_, err := call(e, "/csi.v1.Node/NodeUnpublishVolume", e.ns.NodeUnpublishVolume, req)
	return err
}

func (e *testEnv) NodeGetVolumeStats(req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	return call(e, "/csi.v1.Node/NodeGetVolumeStats", e.ns.NodeGetVolumeStats, req)
}

func (e *testEnv) Probe() (*csi.ProbeResponse, error) {
	return call(e, "/csi.v1.Identity/Probe", e.is.Probe, &csi.ProbeRequest{})
}

// registerNodes announces nodes to the instance, as their node plugins would.
func (e *testEnv) registerNodes(t *testing.T, key string, nodeIDs ...string) {
	t.Helper()
	for _, n := range nodeIDs {
		if err := e.d.instances[key].Attacher.RegisterNode(context.Background(), backend.NodeInfo{NodeID: n}); err != nil {
			t.Fatalf("register node %s with %s: %v", n, key, err)
		}
	}
}

// mustCreate creates a volume and returns its ID.
func (e *testEnv) mustCreate(t *testing.T, req *csi.CreateVolumeRequest) string {
	t.Helper()
	resp, err := e.CreateVolume(req)
	if err != nil {
		t.Fatalf("CreateVolume(%s): %v", req.GetName(), err)
	}
	return resp.GetVolume().GetVolumeId()
}

// mustPublish publishes a volume to a node and returns the publish_context.
func (e *testEnv) mustPublish(t *testing.T, volumeID, nodeID string, c *csi.VolumeCapability, readOnly bool) map[string]string {
	t.Helper()
	resp, err := e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: volumeID, NodeId: nodeID, VolumeCapability: c, Readonly: readOnly})
	if err != nil {
		t.Fatalf("ControllerPublishVolume(%s, %s): %v", volumeID, nodeID, err)
	}
	return resp.GetPublishContext()
}

// image reads a volume's record from its pool, or fails the test.
func (e *testEnv) image(t *testing.T, volumeID string) *backend.Image {
	t.Helper()
	id, err := volumeid.Parse(volumeID)
	if err != nil {
		t.Fatalf("volume ID %q: %v", volumeID, err)
	}
	img, err := e.pools[id.InstanceKey()].Get(context.Background(), id.Image)
	if err != nil {
		t.Fatalf("image of %s: %v", volumeID, err)
	}
	return img
}

// poolFiles lists the image files of a pool.
func (e *testEnv) poolImages(t *testing.T, key string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(e.pools[key].Dir(), "*.img"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func attachedNodes(img *backend.Image) []string {
	var out []string
	for _, a := range img.Attachments {
		out = append(out, a.NodeID)
	}
	return out
}

func mountCap(fsType string, mode csi.VolumeCapability_AccessMode_Mode, flags ...string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType, MountFlags: flags}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func blockCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

// createReq is a valid CreateVolume request: ext4, single-node writer, 10 MiB.
func createReq(name string) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 10 * mib},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("ext4", snw)},
	}
}

// wantCode fails unless err is a gRPC status with code whose message
// contains every one of substrs. codes.OK accepts only a nil error.
func wantCode(t *testing.T, err error, code codes.Code, substrs ...string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("error %v (%T) is not a gRPC status", err, err)
	}
	if st.Code() != code {
		t.Fatalf("code = %s (message %q), want %s", st.Code(), st.Message(), code)
	}
	for _, s := range substrs {
		if !strings.Contains(st.Message(), s) {
			t.Fatalf("message %q does not contain %q", st.Message(), s)
		}
	}
}

// fileUnchanged fails unless path still holds data.
func fileUnchanged(t *testing.T, path string, data []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	if string(got) != string(data) {
		t.Fatalf("%s changed: %q, want %q", path, got, data)
	}
}

// volumeRPC is one RPC that takes a volume ID, called with just that ID.
type volumeRPC struct {
	name string
	call func(id string) error
}

// nodeRPCs are the four node RPCs that take a volume ID, each with a
// request that is valid but for the ID.
func (e *testEnv) nodeRPCs(stage, target string) []volumeRPC {
	return []volumeRPC{
		{"NodeStageVolume", func(id string) error {
			return e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stage, VolumeCapability: mountCap("ext4", snw)})
		}},
		{"NodeUnstageVolume", func(id string) error {
			return e.NodeUnstage(&csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage})
		}},
		{"NodePublishVolume", func(id string) error {
			return e.NodePublish(&csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: stage, TargetPath: target, VolumeCapability: mountCap("ext4", snw)})
		}},
		{"NodeUnpublishVolume", func(id string) error {
			return e.NodeUnpublish(&csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		}},
	}
}

func (e *testEnv) ControllerExpand(volumeID string, bytes int64) (*csi.ControllerExpandVolumeResponse, error) {
	return call(e, "/csi.v1.Controller/ControllerExpandVolume", e.cs.ControllerExpandVolume,
		&csi.ControllerExpandVolumeRequest{VolumeId: volumeID, CapacityRange: &csi.CapacityRange{RequiredBytes: bytes}})
}

// Sizes the tests use.
const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)
