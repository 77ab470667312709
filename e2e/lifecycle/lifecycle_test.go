//go:build root

package lifecycle_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/testutil"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
)

const gib = 1 << 30

// TestFullLifecycle takes a 1 GiB volume of every kind through the whole
// lifecycle on real loop devices and real filesystems, then checks that
// nothing is left: no loop device, no mount, no image.
func TestFullLifecycle(t *testing.T) {
	tests := []struct {
		name       string
		capability *csi.VolumeCapability
		programs   []string
	}{
		{"ext4", lifecycle.MountCapability("ext4"), []string{"mkfs.ext4"}},
		{"xfs", lifecycle.MountCapability("xfs"), []string{"mkfs.xfs"}},
		{"btrfs", lifecycle.MountCapability("btrfs"), []string{"mkfs.btrfs"}},
		{"block", lifecycle.BlockCapability(), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			testutil.RequireCommands(t, tt.programs...)
			drv := harness.Start(t, harness.Options{})
			dir := harness.TempDir(t)
			harness.CheckNoLeaks(t, drv.PoolDir, dir)

			var steps []string
			c := lifecycle.NewClient(drv, func(step, _ string, _ time.Duration, err error) {
				if err == nil {
					steps = append(steps, step)
				}
			})
			err := c.Full(context.Background(), lifecycle.Spec{
				Name: "pvc-lifecycle-" + tt.name, SizeBytes: gib, Capability: tt.capability, WorkDir: dir,
			})
			if err != nil {
				t.Fatal(err)
			}
			want := []string{
				lifecycle.StepCreate, lifecycle.StepControllerPublish, lifecycle.StepStage,
				lifecycle.StepPublish, lifecycle.StepPublish, lifecycle.StepWrite, lifecycle.StepRead,
				lifecycle.StepUnpublish, lifecycle.StepUnpublish, lifecycle.StepUnstage,
				lifecycle.StepStage, lifecycle.StepPublish, lifecycle.StepRead, lifecycle.StepUnpublish,
				lifecycle.StepUnstage, lifecycle.StepControllerUnpublish, lifecycle.StepDelete,
			}
			if strings.Join(steps, ",") != strings.Join(want, ",") {
				t.Errorf("steps:\n got  %v\n want %v", steps, want)
			}
			if left := poolImages(t, drv.PoolDir); len(left) > 0 {
				t.Errorf("pool still holds %v after DeleteVolume", left)
			}
		})
	}
}

// TestFormatOnce checks the one-format rule across unstage and restage: the
// filesystem made at the first stage is the one found at the second (same
// UUID), and the image store records it as formatted.
func TestFormatOnce(t *testing.T) {
	testutil.RequireCommands(t, "mkfs.ext4", "blkid")
	drv := harness.Start(t, harness.Options{})
	dir := harness.TempDir(t)
	harness.CheckNoLeaks(t, drv.PoolDir, dir)
	ctx := context.Background()
	c := lifecycle.NewClient(drv, nil)

	v, err := c.Create(ctx, "pvc-format-once", 64<<20, lifecycle.MountCapability("ext4"), nil, filepath.Join(dir, "globalmount"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { teardown(t, c, v, dir) })
	if err := c.Attach(ctx, v); err != nil {
		t.Fatal(err)
	}
	first := filesystemUUID(t, v.StagingPath)
	if err := c.Unstage(ctx, v); err != nil {
		t.Fatal(err)
	}
	if err := c.Stage(ctx, v); err != nil {
		t.Fatal(err)
	}
	if second := filesystemUUID(t, v.StagingPath); second != first {
		t.Fatalf("filesystem UUID changed from %s to %s across a restage: the volume was formatted twice", first, second)
	}
	meta := imageMetadata(t, drv.PoolDir, v.ID)
	if meta["formatted"] != true || meta["fsType"] != "ext4" {
		t.Fatalf("image metadata formatted=%v fsType=%v, want true and ext4", meta["formatted"], meta["fsType"])
	}
}

// TestWrongFilesystemRefused: a volume that holds xfs, staged again asking
// for ext4, is refused with a clear error, nothing is mounted or left
// attached, and its data is untouched.
func TestWrongFilesystemRefused(t *testing.T) {
	testutil.RequireCommands(t, "mkfs.xfs")
	drv := harness.Start(t, harness.Options{})
	dir := harness.TempDir(t)
	harness.CheckNoLeaks(t, drv.PoolDir, dir)
	ctx := context.Background()
	c := lifecycle.NewClient(drv, nil)

	v, err := c.Create(ctx, "pvc-xfs-then-ext4", 300<<20, lifecycle.MountCapability("xfs"), nil, filepath.Join(dir, "globalmount"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { teardown(t, c, v, dir) })
	if err := c.Attach(ctx, v); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dir, "pod", "volume")
	if err := c.Publish(ctx, v, target, false); err != nil {
		t.Fatal(err)
	}
	p := lifecycle.NewPayload(256 << 10)
	if err := lifecycle.Write(v, target, p); err != nil {
		t.Fatal(err)
	}
	if err := c.Unpublish(ctx, v, target); err != nil {
		t.Fatal(err)
	}
	if err := c.Unstage(ctx, v); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(drv.PoolDir, v.ID[strings.LastIndex(v.ID, "/")+1:]+".img")
	before, err := lifecycle.FileHash(image)
	if err != nil {
		t.Fatal(err)
	}

	// The controller refuses the mismatch first ...
	_, err = drv.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: v.Name, CapacityRange: &csi.CapacityRange{RequiredBytes: 300 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{lifecycle.MountCapability("ext4")},
	})
	wantCode(t, "CreateVolume of the same name as ext4", err, codes.AlreadyExists, "xfs")
	_, err = drv.Controller.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{
		VolumeId: v.ID, NodeId: harness.NodeID, VolumeCapability: lifecycle.MountCapability("ext4"),
	})
	wantCode(t, "ControllerPublishVolume as ext4", err, codes.InvalidArgument, "xfs")

	// ... and the node, which trusts only what blkid finds on the device,
	// refuses it too when asked directly.
	asExt4 := *v
	asExt4.Capability = lifecycle.MountCapability("ext4")
	err = c.Stage(ctx, &asExt4)
	wantCode(t, "NodeStageVolume as ext4", err, codes.FailedPrecondition, "xfs")

	if m := harness.MountsUnder(dir); len(m) > 0 {
		t.Errorf("refused stage left mounts: %v", m)
	}
	if l := harness.LoopDevicesUnder(drv.PoolDir); len(l) > 0 {
		t.Errorf("refused stage left loop devices: %v", l)
	}
	after, err := lifecycle.FileHash(image)
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatal("the image changed although the stage was refused")
	}

	// Staged as what it is, the data is all there.
	if err := c.Stage(ctx, v); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, v, target, false); err != nil {
		t.Fatal(err)
	}
	if err := lifecycle.Check(v, target, p); err != nil {
		t.Fatal(err)
	}
}

func wantCode(t *testing.T, what string, err error, code codes.Code, mention string) {
	t.Helper()
	if status.Code(err) != code {
		t.Errorf("%s: got %v, want %s", what, err, code)
		return
	}
	if !strings.Contains(status.Convert(err).Message(), mention) {
		t.Errorf("%s: message %q does not mention %q", what, status.Convert(err).Message(), mention)
	}
}

// teardown undoes whatever of the lifecycle a test reached: it unpublishes
// every pod target ("volume") under root, then unstages, unpublishes and
// deletes. Every step is idempotent, so it runs all of them.
func teardown(t *testing.T, c *lifecycle.Client, v *lifecycle.Volume, root string) {
	t.Helper()
	ctx := context.Background()
	_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "volume" {
			if err := c.Unpublish(ctx, v, path); err != nil {
				t.Errorf("teardown: %v", err)
			}
		}
		return nil
	})
	for _, step := range []func(context.Context, *lifecycle.Volume) error{c.Unstage, c.ControllerUnpublish, c.Delete} {
		if err := step(ctx, v); err != nil {
			t.Errorf("teardown: %v", err)
		}
	}
}

func filesystemUUID(t *testing.T, mountPoint string) string {
	t.Helper()
	out, err := runOutput("findmnt", "-n", "-o", "UUID", "--mountpoint", mountPoint)
	if err != nil || strings.TrimSpace(out) == "" {
		t.Fatalf("findmnt %s: %v %q", mountPoint, err, out)
	}
	return strings.TrimSpace(out)
}

func imageMetadata(t *testing.T, poolDir, volumeID string) map[string]any {
	t.Helper()
	image := volumeID[strings.LastIndex(volumeID, "/")+1:]
	data, err := os.ReadFile(filepath.Join(poolDir, image+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// poolImages lists image files and metadata left in a pool.
func poolImages(t *testing.T, poolDir string) []string {
	t.Helper()
	entries, err := os.ReadDir(poolDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".img") || (strings.HasSuffix(e.Name(), ".json") && !strings.HasPrefix(e.Name(), ".")) {
			out = append(out, e.Name())
		}
	}
	return out
}

func runOutput(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).Output()
	return string(out), err
}

// TestBlockReadOnlyPublish: a read-only publish of a block volume gets a
// read-only loop device of its own (a read-only bind of a writable device
// node would not stop writes), which goes away with the publish; asking
// for read-only where the volume is already published read-write is
// refused without attaching anything.
func TestBlockReadOnlyPublish(t *testing.T) {
	drv := harness.Start(t, harness.Options{})
	dir := harness.TempDir(t)
	harness.CheckNoLeaks(t, drv.PoolDir, dir)
	ctx := context.Background()
	c := lifecycle.NewClient(drv, nil)

	v, err := c.Create(ctx, "pvc-block-ro", 64<<20, lifecycle.BlockCapability(), nil, filepath.Join(dir, "staging", "pv"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { teardown(t, c, v, dir) })
	if err := c.Attach(ctx, v); err != nil {
		t.Fatal(err)
	}
	rw, ro := filepath.Join(dir, "pod-rw", "volume"), filepath.Join(dir, "pod-ro", "volume")
	if err := c.Publish(ctx, v, rw, false); err != nil {
		t.Fatal(err)
	}
	p := lifecycle.NewPayload(64 << 10)
	if err := lifecycle.Write(v, rw, p); err != nil {
		t.Fatal(err)
	}
	if n := len(harness.LoopDevicesUnder(drv.PoolDir)); n != 1 {
		t.Fatalf("%d loop devices after the first publish, want 1", n)
	}

	err = c.Publish(ctx, v, rw, true)
	wantCode(t, "read-only publish over a read-write one", err, codes.AlreadyExists, "read-only")
	if n := len(harness.LoopDevicesUnder(drv.PoolDir)); n != 1 {
		t.Fatalf("%d loop devices after a refused publish, want 1: the refusal leaked a device", n)
	}

	if err := c.Publish(ctx, v, ro, true); err != nil {
		t.Fatal(err)
	}
	if n := len(harness.LoopDevicesUnder(drv.PoolDir)); n != 2 {
		t.Fatalf("%d loop devices with a read-only publish, want 2 (the staged one and a read-only view)", n)
	}
	if err := lifecycle.Check(v, ro, p); err != nil {
		t.Fatal(err)
	}
	if err := lifecycle.Write(v, ro, lifecycle.NewPayload(4096)); err == nil {
		t.Fatal("a write through the read-only publish succeeded")
	}
	if err := lifecycle.Check(v, rw, p); err != nil {
		t.Fatalf("after the refused write: %v", err)
	}
	if err := c.Unpublish(ctx, v, ro); err != nil {
		t.Fatal(err)
	}
	if n := len(harness.LoopDevicesUnder(drv.PoolDir)); n != 1 {
		t.Fatalf("%d loop devices after the read-only publish ended, want 1", n)
	}
}

// TestVolumeStats: bytes and inodes for a filesystem volume at its staging
// and pod paths, the size for a block volume, and NOT_FOUND for a path that
// is not (or no longer) the volume's, rather than another filesystem's usage.
func TestVolumeStats(t *testing.T) {
	drv := harness.Start(t, harness.Options{})
	dir := harness.TempDir(t)
	harness.CheckNoLeaks(t, drv.PoolDir, dir)
	ctx := context.Background()
	c := lifecycle.NewClient(drv, nil)
	stats := func(v *lifecycle.Volume, path string) (*csi.NodeGetVolumeStatsResponse, error) {
		return drv.Node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: v.ID, VolumePath: path})
	}

	fsVol, err := c.Create(ctx, "pvc-stats-fs", 256<<20, lifecycle.MountCapability("ext4"), nil, filepath.Join(dir, "fs", "globalmount"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { teardown(t, c, fsVol, filepath.Join(dir, "fs")) })
	blockVol, err := c.Create(ctx, "pvc-stats-block", 64<<20, lifecycle.BlockCapability(), nil, filepath.Join(dir, "block", "staging"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { teardown(t, c, blockVol, filepath.Join(dir, "block")) })
	fsTarget, blockTarget := filepath.Join(dir, "fs", "pod", "volume"), filepath.Join(dir, "block", "pod", "volume")
	for _, v := range []*lifecycle.Volume{fsVol, blockVol} {
		if err := c.Attach(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Publish(ctx, fsVol, fsTarget, false); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, blockVol, blockTarget, false); err != nil {
		t.Fatal(err)
	}

	for _, path := range []string{fsVol.StagingPath, fsTarget} {
		resp, err := stats(fsVol, path)
		if err != nil {
			t.Fatalf("stats of %s: %v", path, err)
		}
		var bytes, inodes *csi.VolumeUsage
		for _, u := range resp.GetUsage() {
			switch u.GetUnit() {
			case csi.VolumeUsage_BYTES:
				bytes = u
			case csi.VolumeUsage_INODES:
				inodes = u
			}
		}
		// ext4 keeps some of the device for its own metadata.
		if bytes == nil || bytes.GetTotal() <= 200<<20 || bytes.GetTotal() > 256<<20 || bytes.GetAvailable() <= 0 || bytes.GetUsed() < 0 {
			t.Errorf("bytes of %s = %v, want a total a little under 256 MiB", path, bytes)
		}
		if inodes == nil || inodes.GetTotal() <= 0 || inodes.GetUsed() <= 0 {
			t.Errorf("inodes of %s = %v", path, inodes)
		}
	}
	resp, err := stats(blockVol, blockTarget)
	if err != nil {
		t.Fatal(err)
	}
	if u := resp.GetUsage(); len(u) != 1 || u[0].GetTotal() != 64<<20 {
		t.Errorf("block stats = %v, want a total of exactly 64 MiB", u)
	}

	// Another volume's mount, a plain directory: not this volume.
	_, err = stats(blockVol, fsTarget)
	wantCode(t, "stats of another volume's mount", err, codes.NotFound, "not a mount of volume")
	_, err = stats(fsVol, dir)
	wantCode(t, "stats of a plain directory", err, codes.NotFound, "not a mount of volume")
	_, err = stats(fsVol, blockTarget)
	wantCode(t, "stats of another volume's device", err, codes.NotFound, "not a mount of volume "+fsVol.ID+" (it holds a bind of device")

	if err := c.Unpublish(ctx, fsVol, fsTarget); err != nil {
		t.Fatal(err)
	}
	if err := c.Unstage(ctx, fsVol); err != nil {
		t.Fatal(err)
	}
	_, err = stats(fsVol, fsVol.StagingPath)
	wantCode(t, "stats after unstage", err, codes.NotFound, fsVol.StagingPath)
}

// TestUnstageWhilePublished: unstaging a volume a pod still uses is refused,
// naming the pod's path, and changes nothing; filesystem and block alike.
func TestUnstageWhilePublished(t *testing.T) {
	for _, tt := range []struct {
		name       string
		capability *csi.VolumeCapability
	}{
		{"ext4", lifecycle.MountCapability("ext4")},
		{"block", lifecycle.BlockCapability()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			drv := harness.Start(t, harness.Options{})
			dir := harness.TempDir(t)
			harness.CheckNoLeaks(t, drv.PoolDir, dir)
			ctx := context.Background()
			c := lifecycle.NewClient(drv, nil)
			v, err := c.Create(ctx, "pvc-busy-"+tt.name, 64<<20, tt.capability, nil, filepath.Join(dir, "staging"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { teardown(t, c, v, dir) })
			target := filepath.Join(dir, "pod", "volume")
			if err := c.Attach(ctx, v); err != nil {
				t.Fatal(err)
			}
			if err := c.Publish(ctx, v, target, false); err != nil {
				t.Fatal(err)
			}
			p := lifecycle.NewPayload(4096)
			if err := lifecycle.Write(v, target, p); err != nil {
				t.Fatal(err)
			}
			wantCode(t, "NodeUnstageVolume while published", c.Unstage(ctx, v), codes.FailedPrecondition, target)
			if err := lifecycle.Check(v, target, p); err != nil {
				t.Fatalf("after the refused unstage: %v", err)
			}
			if err := c.Unpublish(ctx, v, target); err != nil {
				t.Fatal(err)
			}
			if err := c.Unstage(ctx, v); err != nil {
				t.Fatal(err)
			}
		})
	}
}
