package driver

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

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
			rec, err := node.ReadStageRecord(staging)
			if err != nil {
				t.Fatalf("stage record: %v", err)
			}
			if rec.VolumeID != vol || rec.Device != "/dev/loop0" || rec.AccessType != "block" || rec.ReadOnly != readOnly {
				t.Fatalf("stage record %+v, want %s on /dev/loop0, block, read-only %t", rec, vol, readOnly)
			}
			// Block staging attaches only: nothing is created at the staging path.
			if _, err := os.Lstat(staging); !os.IsNotExist(err) {
				t.Fatalf("staging path of a block volume: %v", err)
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
	if _, err := node.ReadStageRecord(staging); err == nil {
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
	if err := node.WriteStageRecord(staging, node.StageRecord{VolumeID: vol, Device: "/dev/loop9", AccessType: "mount", FsType: "ext4"}); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(target, 0o750); err != nil {
		t.Fatal(err)
	}

	for i := 0; i < 2; i++ { // and again: idempotent
		wantCode(t, e.NodeUnpublish(&csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: target}), codes.OK)
		wantCode(t, e.NodeUnstage(&csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: staging}), codes.OK)
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Fatalf("target_path after NodeUnpublishVolume: %v", err)
	}
	if _, err := os.Lstat(node.StageRecordPath(staging)); !os.IsNotExist(err) {
		t.Fatalf("stage record after NodeUnstageVolume: %v", err)
	}
	if calls := e.loops[defaultKey].Calls; len(calls) != 0 {
		t.Fatalf("loop driver used: %v", calls)
	}
}

func TestNodeGetVolumeStatsNotAttached(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	tests := []struct {
		name, vol, path string
		code            codes.Code
		want            string
	}{
		{"not attached", "loop/default/pvc-x", t.TempDir(), codes.NotFound, "is not a mount of volume loop/default/pvc-x"},
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
