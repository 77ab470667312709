package driver

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/node"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// The node tests stop short of anything that would stat, format or mount a
// device: FakeLoopDevices names its devices /dev/loopN, which on a test
// machine are real devices.

// newBlockVolume creates a block volume and publishes it to this node.
func newBlockVolume(t *testing.T, e *testEnv, name string, readOnly bool) (volumeID, imagePath string, pc map[string]string) {
	t.Helper()
	e.registerNodes(t, defaultKey, testNodeID)
	req := createReq(name)
	req.VolumeCapabilities = []*csi.VolumeCapability{blockCap(snw)}
	volumeID = e.mustCreate(t, req)
	pc = e.mustPublish(t, volumeID, testNodeID, blockCap(snw), readOnly)
	id, _ := volumeid.Parse(volumeID)
	return volumeID, e.pools[defaultKey].ImagePath(id.Image), pc
}

func TestNodeStageBlock(t *testing.T) {
	t.Parallel()
	for _, readOnly := range []bool{false, true} {
		name := map[bool]string{false: "read-write", true: "read-only"}[readOnly]
		t.Run(name, func(t *testing.T) {
			e := newTestEnv(t)
			vol, imagePath, pc := newBlockVolume(t, e, "pvc-block-"+name, readOnly)
			staging := filepath.Join(t.TempDir(), "staging", "pv", "pvc-block")
			err := e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: staging, VolumeCapability: blockCap(snw), PublishContext: pc})
			if err != nil {
				t.Fatalf("NodeStageVolume: %v", err)
			}
			fake := e.loops[defaultKey]
			wantCalls := []string{"attach " + imagePath + " ro=" + map[bool]string{false: "false", true: "true"}[readOnly]}
			if !slices.Equal(fake.Calls, wantCalls) {
				t.Fatalf("loop calls %v, want %v", fake.Calls, wantCalls)
			}
			rec, err := e.host.StageRecord(staging)
			if err != nil {
				t.Fatalf("stage record: %v", err)
			}
			if rec.VolumeID != vol || rec.Device != "/dev/loop0" || rec.AccessType != "block" || rec.ReadOnly != readOnly {
				t.Fatalf("stage record %+v, want %s on /dev/loop0, block, read-only %t", rec, vol, readOnly)
			}
			// Block staging attaches only: nothing is created at the staging path.
			if e.host.Exists(staging) {
				t.Fatal("a block stage made something at the staging path")
			}
		})
	}
}

// A stage that fails after the attach detaches again: kubelet will not call
// NodeUnstageVolume for it. Here the node finds that the block volume is
// asked for as a filesystem, which would format its raw data.
func TestNodeStageRollsBackTheAttach(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	vol, imagePath, pc := newBlockVolume(t, e, "pvc-rollback", false)
	staging := filepath.Join(t.TempDir(), "staging")
	err := e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: staging, VolumeCapability: mountCap("ext4", snw), PublishContext: pc})
	wantCode(t, err, codes.InvalidArgument, "created for block access, not mount")
	fake := e.loops[defaultKey]
	if want := []string{"attach " + imagePath + " ro=false", "detach /dev/loop0"}; !slices.Equal(fake.Calls, want) {
		t.Fatalf("loop calls %v, want %v", fake.Calls, want)
	}
	if len(fake.Devices) != 0 {
		t.Fatalf("devices left attached: %v", fake.Devices)
	}
}

func TestNodeStageRefusals(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.registerNodes(t, defaultKey, testNodeID)
	req := createReq("pvc-unpublished")
	req.VolumeCapabilities = []*csi.VolumeCapability{blockCap(snw)}
	unpublished := e.mustCreate(t, req)
	published, _, _ := newBlockVolume(t, e, "pvc-published", false)
	staging := filepath.Join(t.TempDir(), "staging")

	tests := []struct {
		name string
		req  *csi.NodeStageVolumeRequest
		code codes.Code
		want []string
	}{
		{"not published to this node", &csi.NodeStageVolumeRequest{VolumeId: unpublished, StagingTargetPath: staging, VolumeCapability: blockCap(snw)},
			codes.FailedPrecondition, []string{"not published to node " + `"` + testNodeID + `"`}},
		{"controller and node disagree on the pool", &csi.NodeStageVolumeRequest{VolumeId: published, StagingTargetPath: staging, VolumeCapability: blockCap(snw),
			PublishContext: map[string]string{"imagePath": "/elsewhere/pvc-published.img", "readOnly": "false"}},
			codes.FailedPrecondition, []string{"/elsewhere/pvc-published.img", "disagree"}},
		{"volume does not exist", &csi.NodeStageVolumeRequest{VolumeId: "loop/default/pvc-missing", StagingTargetPath: staging, VolumeCapability: blockCap(snw)},
			codes.NotFound, []string{"pvc-missing"}},
		{"instance not configured", &csi.NodeStageVolumeRequest{VolumeId: "loop/other/pvc-published", StagingTargetPath: staging, VolumeCapability: blockCap(snw)},
			codes.FailedPrecondition, []string{"loop/other", "not configured"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantCode(t, e.NodeStage(tt.req), tt.code, tt.want...)
		})
	}
	if calls := e.loops[defaultKey].Calls; len(calls) != 0 {
		t.Fatalf("refused stages reached the loop driver: %v", calls)
	}
	if _, err := e.host.StageRecord(staging); err == nil {
		t.Fatal("a refused stage left a stage record")
	}
}

// Unstage and unpublish of a volume that is not (or no longer) there
// succeed, and clean up what a crash left behind.
func TestNodeUnstageUnpublishNothing(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	const vol = "loop/default/pvc-gone"
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")

	// A record left by a stage before a node reboot.
	if err := e.host.WriteStageRecord(staging, node.StageRecord{VolumeID: vol, Device: "/dev/loop9", AccessType: "mount", FsType: "ext4"}); err != nil {
		t.Fatal(err)
	}
	if err := e.host.MakeDir(target); err != nil {
		t.Fatal(err)
	}

	for i := 0; i < 2; i++ { // and again: idempotent
		wantCode(t, e.NodeUnpublish(&csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: target}), codes.OK)
		wantCode(t, e.NodeUnstage(&csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: staging}), codes.OK)
	}
	if e.host.Exists(target) {
		t.Fatal("target_path left after NodeUnpublishVolume")
	}
	if e.host.Exists(node.StageRecordPath(staging)) {
		t.Fatal("stage record left after NodeUnstageVolume")
	}
	if calls := e.loops[defaultKey].Calls; len(calls) != 0 {
		t.Fatalf("loop driver used: %v", calls)
	}
}

func TestNodeGetVolumeStatsNotAttached(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	notAMount := filepath.Join(e.kubelet, "pods", "p", "mount")
	if err := e.host.MakeDir(notAMount); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, vol, path string
		code            codes.Code
		want            string
	}{
		{"not attached", "loop/default/pvc-x", notAMount, codes.NotFound, "is not a mount of volume loop/default/pvc-x"},
		{"instance not configured", "loop/other/pvc-x", t.TempDir(), codes.FailedPrecondition, "loop/other"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.NodeGetVolumeStats(&csi.NodeGetVolumeStatsRequest{VolumeId: tt.vol, VolumePath: tt.path})
			wantCode(t, err, tt.code, tt.want)
		})
	}
}

// A failed stage leaves a device that was attached before it (staged
// elsewhere) attached.
func TestNodeStageFailureKeepsAnEarlierDevice(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	vol, _, pc := newBlockVolume(t, e, "pvc-keep", false)
	staging := filepath.Join(t.TempDir(), "staging")
	if err := e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: staging, VolumeCapability: blockCap(snw), PublishContext: pc}); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "other")
	err := e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: other, VolumeCapability: mountCap("ext4", snw), PublishContext: pc})
	wantCode(t, err, codes.InvalidArgument, "created for block access")
	fake := e.loops[defaultKey]
	if slices.Contains(fake.Calls, "detach /dev/loop0") || len(fake.Devices) != 1 {
		t.Fatalf("the staged device was taken away: calls %v, devices %v", fake.Calls, fake.Devices)
	}
}

// The four node RPCs and the node's read-only ones, through the gRPC
// translation, on the in-memory host: every success path without root.
func TestNodeRPCsWholeLifecycle(t *testing.T) {
	t.Parallel()
	for _, c := range []*csi.VolumeCapability{mountCap("xfs", snw), blockCap(snw)} {
		block := c.GetBlock() != nil
		t.Run(map[bool]string{false: "mount", true: "block"}[block], func(t *testing.T) {
			e := newTestEnv(t)
			e.registerNodes(t, defaultKey, testNodeID)
			req := createReq("pvc-rpcs")
			req.CapacityRange.RequiredBytes = 512 * mib
			req.VolumeCapabilities = []*csi.VolumeCapability{c}
			vol := e.mustCreate(t, req)
			pc := e.mustPublish(t, vol, testNodeID, c, false)
			staging := filepath.Join(e.kubelet, "plugins", "kubernetes.io", "csi", "pv", "pvc-rpcs", "globalmount")
			target := filepath.Join(e.kubelet, "pods", "p1", "volumes", "kubernetes.io~csi", "pvc-rpcs", "mount")
			for range 2 {
				if err := e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: staging, VolumeCapability: c, PublishContext: pc}); err != nil {
					t.Fatalf("NodeStageVolume: %v", err)
				}
				if err := e.NodePublish(&csi.NodePublishVolumeRequest{VolumeId: vol, StagingTargetPath: staging, TargetPath: target, VolumeCapability: c, PublishContext: pc}); err != nil {
					t.Fatalf("NodePublishVolume: %v", err)
				}
			}
			if !block && e.host.FilesystemOf(e.pools[defaultKey].ImagePath(strings.TrimPrefix(vol, defaultKey+"/"))) != "xfs" {
				t.Fatal("the volume holds no xfs after its stage")
			}
			stats, err := e.NodeGetVolumeStats(&csi.NodeGetVolumeStatsRequest{VolumeId: vol, VolumePath: target})
			if err != nil || stats.GetUsage()[0].GetTotal() != 512*mib {
				t.Fatalf("NodeGetVolumeStats = %v, %v", stats, err)
			}
			if _, err := e.ControllerExpand(vol, 1024*mib); err != nil {
				t.Fatal(err)
			}
			grown, err := call(e, "/csi.v1.Node/NodeExpandVolume", e.ns.NodeExpandVolume, &csi.NodeExpandVolumeRequest{VolumeId: vol, VolumePath: target, StagingTargetPath: staging})
			if err != nil || grown.GetCapacityBytes() != 1024*mib {
				t.Fatalf("NodeExpandVolume = %v, %v", grown, err)
			}
			wantCode(t, e.NodeUnstage(&csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: staging}), codes.FailedPrecondition, "still published at "+target)
			for range 2 {
				if err := e.NodeUnpublish(&csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: target}); err != nil {
					t.Fatalf("NodeUnpublishVolume: %v", err)
				}
				if err := e.NodeUnstage(&csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: staging}); err != nil {
					t.Fatalf("NodeUnstageVolume: %v", err)
				}
			}
			if mounts := e.host.MountPoints(); len(mounts) != 0 {
				t.Fatalf("mounts left: %v", mounts)
			}
			if devs := e.loops[defaultKey].Devices; len(devs) != 0 {
				t.Fatalf("devices left: %v", devs)
			}
			if e.host.Exists(target) || e.host.Exists(staging+".spindle-stage.json") {
				t.Fatal("the target or the stage record was left")
			}
		})
	}
}

// After a node plugin was killed during mkfs, the mkfs it left running
// holds the volume's device: the retried NodeStageVolume is ABORTED (kubelet
// retries it) and names the process, not a mount that is not there.
func TestNodeStageWhileAnOrphanedMkfsHoldsTheDevice(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.registerNodes(t, defaultKey, testNodeID)
	vol := e.mustCreate(t, createReq("pvc-orphan"))
	pc := e.mustPublish(t, vol, testNodeID, mountCap("ext4", snw), false)
	id, _ := volumeid.Parse(vol)
	inst := e.d.instances[defaultKey]
	dev, err := inst.Attacher.Attach(t.Context(), backend.AttachRequest{ImageID: id.Image, NodeID: testNodeID, PublishContext: pc})
	if err != nil {
		t.Fatal(err)
	}
	e.host.HoldOpen(dev.Path, 4242, "mkfs.ext4")
	staging := filepath.Join(t.TempDir(), "staging", "pv", "pvc-orphan", "globalmount")
	err = e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: staging, VolumeCapability: mountCap("ext4", snw), PublishContext: pc})
	wantCode(t, err, codes.Aborted, dev.Path, "pid 4242 (mkfs.ext4)", "retry")
}
