//go:build root

package lifecycle_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
	"github.com/spindle-csi/spindle/internal/testutil"
)

const mib = 1 << 20

// attachAndPublish stages v and publishes it at a pod path under dir.
func attachAndPublish(t *testing.T, c *lifecycle.Client, v *lifecycle.Volume, dir, pod string) string {
	t.Helper()
	ctx := context.Background()
	target := filepath.Join(dir, pod, "volume")
	if err := c.Attach(ctx, v); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, v, target, false); err != nil {
		t.Fatal(err)
	}
	return target
}

// detachAll unpublishes target and unstages v.
func detachAll(t *testing.T, c *lifecycle.Client, v *lifecycle.Volume, target string) {
	t.Helper()
	ctx := context.Background()
	if err := c.Unpublish(ctx, v, target); err != nil {
		t.Fatal(err)
	}
	if err := c.Detach(ctx, v); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotRestore: write data → snapshot → write more → restore the
// snapshot into a new volume → it holds exactly the old data. On a pool
// that can reflink (xfs) the snapshot is taken while the volume is staged
// and published, and is crash-consistent; on one that cannot (the ext4 of
// /tmp) such a snapshot is refused, and taken once the volume is detached.
func TestSnapshotRestore(t *testing.T) {
	for _, tt := range []struct {
		name    string
		pool    func(t *testing.T) string
		fsType  string
		reflink bool
	}{
		{"ext4 volume, pool without reflink", func(t *testing.T) string { return "" }, "ext4", false},
		{"xfs volume, xfs pool with reflink", func(t *testing.T) string { return harness.FilesystemPool(t, "xfs", 2<<30) }, "xfs", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			testutil.RequireCommands(t, "mkfs."+tt.fsType)
			drv := harness.Start(t, harness.Options{PoolDir: tt.pool(t)})
			dir := harness.TempDir(t)
			harness.CheckNoLeaks(t, drv.PoolDir, dir)
			ctx := context.Background()
			c := lifecycle.NewClient(drv, nil)

			src, err := c.Create(ctx, "pvc-snap-src", 320*mib, lifecycle.MountCapability(tt.fsType), nil, filepath.Join(dir, "src", "globalmount"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { teardown(t, c, src, filepath.Join(dir, "src")) })
			target := attachAndPublish(t, c, src, filepath.Join(dir, "src"), "pod")
			before := lifecycle.NewPayload(1 * mib)
			if err := lifecycle.Write(src, target, before); err != nil {
				t.Fatal(err)
			}

			var snapID string
			if tt.reflink {
				if snapID, err = c.Snapshot(ctx, "snap-live", src); err != nil {
					t.Fatalf("snapshot of a published volume on a reflink pool: %v", err)
				}
			} else {
				_, err := c.Snapshot(ctx, "snap-live", src)
				wantCode(t, "snapshot of a published volume on a pool without reflink", err, codes.FailedPrecondition, "reflink")
				detachAll(t, c, src, target)
				if snapID, err = c.Snapshot(ctx, "snap-detached", src); err != nil {
					t.Fatal(err)
				}
				target = attachAndPublish(t, c, src, filepath.Join(dir, "src"), "pod")
			}
			t.Cleanup(func() {
				if err := c.DeleteSnapshot(context.Background(), snapID); err != nil {
					t.Errorf("delete snapshot: %v", err)
				}
			})

			after := lifecycle.NewPayload(1 * mib)
			if err := lifecycle.Write(src, target, after); err != nil {
				t.Fatal(err)
			}

			restored, err := c.CreateFrom(ctx, "pvc-restored", 0, lifecycle.MountCapability(""), nil, filepath.Join(dir, "restored", "globalmount"), lifecycle.FromSnapshot(snapID))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { teardown(t, c, restored, filepath.Join(dir, "restored")) })
			if restored.CapacityBytes != src.CapacityBytes {
				t.Errorf("restored volume is %d bytes, want the source's %d", restored.CapacityBytes, src.CapacityBytes)
			}
			rt := attachAndPublish(t, c, restored, filepath.Join(dir, "restored"), "pod")
			if err := lifecycle.Check(restored, rt, before); err != nil {
				t.Fatalf("restored volume: %v", err)
			}
			if err := lifecycle.Check(src, target, after); err != nil {
				t.Fatalf("source volume: %v", err)
			}
			if got, want := filesystemType(t, rt), tt.fsType; got != want {
				t.Errorf("restored volume holds %s, want the snapshot's %s", got, want)
			}
		})
	}
}

// TestCloneOfStagedXFS: a clone of an xfs volume that is staged and in use
// is mounted on the same node beside it (the copy has the same filesystem
// UUID, so this needs nouuid), holds the source's data, and was not
// formatted again.
func TestCloneOfStagedXFS(t *testing.T) {
	testutil.RequireCommands(t, "mkfs.xfs")
	drv := harness.Start(t, harness.Options{PoolDir: harness.FilesystemPool(t, "xfs", 2<<30)})
	dir := harness.TempDir(t)
	harness.CheckNoLeaks(t, drv.PoolDir, dir)
	ctx := context.Background()
	c := lifecycle.NewClient(drv, nil)

	src, err := c.Create(ctx, "pvc-clone-src", 320*mib, lifecycle.MountCapability("xfs"), nil, filepath.Join(dir, "src", "globalmount"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { teardown(t, c, src, filepath.Join(dir, "src")) })
	srcTarget := attachAndPublish(t, c, src, filepath.Join(dir, "src"), "pod")
	p := lifecycle.NewPayload(1 * mib)
	if err := lifecycle.Write(src, srcTarget, p); err != nil {
		t.Fatal(err)
	}

	clone, err := c.CreateFrom(ctx, "pvc-clone", 400*mib, lifecycle.MountCapability("xfs"), nil, filepath.Join(dir, "clone", "globalmount"), lifecycle.FromVolume(src.ID))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { teardown(t, c, clone, filepath.Join(dir, "clone")) })
	cloneTarget := attachAndPublish(t, c, clone, filepath.Join(dir, "clone"), "pod")
	if err := lifecycle.Check(clone, cloneTarget, p); err != nil {
		t.Fatalf("clone: %v", err)
	}
	if a, b := filesystemUUID(t, src.StagingPath), filesystemUUID(t, clone.StagingPath); a != b {
		t.Errorf("clone's filesystem UUID %s differs from the source's %s: it was formatted again", b, a)
	}
	// The clone is bigger than its source, and its filesystem grew to fill
	// it when it was staged.
	if total := statfsBytes(t, cloneTarget); total <= statfsBytes(t, srcTarget)+50*mib {
		t.Errorf("clone's filesystem is %d bytes; want it grown to its 400 MiB device", total)
	}
	// Writing the clone leaves the source alone.
	if err := lifecycle.Write(clone, cloneTarget, lifecycle.NewPayload(4096)); err != nil {
		t.Fatal(err)
	}
	if err := lifecycle.Check(src, srcTarget, p); err != nil {
		t.Fatalf("source after writing the clone: %v", err)
	}
	// The source, whose extents the clone now shares, stages again: its
	// device keeps the 4 KiB sectors its filesystem was made for.
	detachAll(t, c, src, srcTarget)
	srcTarget = attachAndPublish(t, c, src, filepath.Join(dir, "src"), "pod")
	if err := lifecycle.Check(src, srcTarget, p); err != nil {
		t.Fatalf("source restaged after the clone: %v", err)
	}
}

// TestVolumeHealth: the health RPCs report a healthy volume as such, a
// staging mount that vanished behind the driver's back as inaccessible, and
// an image whose file is gone as data loss, from the controller's list too.
func TestVolumeHealth(t *testing.T) {
	drv := harness.Start(t, harness.Options{})
	dir := harness.TempDir(t)
	harness.CheckNoLeaks(t, drv.PoolDir, dir)
	ctx := context.Background()
	c := lifecycle.NewClient(drv, nil)
	v, err := c.Create(ctx, "pvc-health", 64*mib, lifecycle.MountCapability("ext4"), nil, filepath.Join(dir, "globalmount"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { teardown(t, c, v, dir) })
	target := attachAndPublish(t, c, v, dir, "pod")

	nodeHealth := func() []string {
		t.Helper()
		resp, err := drv.Node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: v.ID, StagingTargetPath: v.StagingPath, VolumePublishPath: target})
		if err != nil {
			t.Fatal(err)
		}
		return healthReasons(resp.GetVolumeHealth())
	}
	if got := nodeHealth(); len(got) != 0 {
		t.Fatalf("healthy volume reported %v", got)
	}
	ch, err := drv.Controller.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: v.ID})
	if err != nil || len(ch.GetVolumeHealth().GetHealthStatuses()) != 0 {
		t.Fatalf("ControllerGetVolumeHealth of a healthy volume = %v, %v", ch, err)
	}

	// The pod's bind and the staging mount disappear (an admin's umount).
	for _, p := range []string{target, v.StagingPath} {
		if err := unix.Unmount(p, 0); err != nil {
			t.Fatal(err)
		}
	}
	if got := nodeHealth(); !slices.Contains(got, "INACCESSIBLE/StagingMountMissing") || !slices.Contains(got, "INACCESSIBLE/PublishMountMissing") {
		t.Errorf("after unmounting behind the driver's back, node health = %v", got)
	}

	// The image file is removed from the pool: its data is gone.
	image := filepath.Join(drv.PoolDir, v.ID[strings.LastIndex(v.ID, "/")+1:]+".img")
	if err := os.Remove(image); err != nil {
		t.Fatal(err)
	}
	ch, err = drv.Controller.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: v.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got := healthReasons(ch.GetVolumeHealth()); !slices.Contains(got, "DATA_LOSS/ImageMissing") {
		t.Errorf("controller health with the image gone = %v", got)
	}
	list, err := drv.Controller.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetEntries()) != 1 || list.GetEntries()[0].GetVolumeId() != v.ID {
		t.Errorf("ControllerListVolumeHealth = %v, want just %s", list.GetEntries(), v.ID)
	}
	if got := nodeHealth(); !slices.Contains(got, "DATA_LOSS/ImageMissing") {
		t.Errorf("node health with the image gone = %v", got)
	}
}

func healthReasons(h *csi.VolumeHealth) []string {
	var out []string
	for _, e := range h.GetHealthStatuses() {
		out = append(out, e.GetStatus().String()+"/"+e.GetReason())
	}
	return out
}

// TestExpand grows volumes and checks that the filesystem (or device) the
// pod sees has the new size and still holds its data: xfs and btrfs while
// mounted, ext4 while unstaged (grown at the next stage), a block volume
// while published; online ext4 where the node plugin may grow it.
func TestExpand(t *testing.T) {
	for _, tt := range []struct {
		name       string
		capability *csi.VolumeCapability
		from, to   int64
		online     bool
	}{
		{"xfs online", lifecycle.MountCapability("xfs"), 320 * mib, 480 * mib, true},
		{"btrfs online", lifecycle.MountCapability("btrfs"), 256 * mib, 384 * mib, true},
		{"ext4 offline", lifecycle.MountCapability("ext4"), 64 * mib, 160 * mib, false},
		{"ext4 online", lifecycle.MountCapability("ext4"), 64 * mib, 160 * mib, true},
		{"block online", lifecycle.BlockCapability(), 64 * mib, 96 * mib, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if fs := tt.capability.GetMount().GetFsType(); fs != "" {
				testutil.RequireCommands(t, "mkfs."+fs)
			}
			drv := harness.Start(t, harness.Options{})
			dir := harness.TempDir(t)
			harness.CheckNoLeaks(t, drv.PoolDir, dir)
			ctx := context.Background()
			c := lifecycle.NewClient(drv, nil)
			v, err := c.Create(ctx, "pvc-expand", tt.from, tt.capability, nil, filepath.Join(dir, "globalmount"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { teardown(t, c, v, dir) })
			target := attachAndPublish(t, c, v, dir, "pod")
			p := lifecycle.NewPayload(256 << 10)
			if err := lifecycle.Write(v, target, p); err != nil {
				t.Fatal(err)
			}
			before := sizeAt(t, v, target)

			err = c.ControllerExpand(ctx, v, tt.from/2)
			wantCode(t, "shrink", err, codes.OutOfRange, "shrink")
			if err := c.ControllerExpand(ctx, v, tt.to); err != nil {
				t.Fatal(err)
			}
			if v.CapacityBytes != tt.to {
				t.Fatalf("ControllerExpandVolume gave %d bytes, want %d", v.CapacityBytes, tt.to)
			}

			if tt.online {
				size, err := c.NodeExpand(ctx, v, target)
				if status.Code(err) == codes.FailedPrecondition && strings.Contains(err.Error(), "CAP_SYS_RESOURCE") {
					// The driver said clearly why; the volume still works,
					// and the offline path (next test case) grows it.
					if err := lifecycle.Check(v, target, p); err != nil {
						t.Fatal(err)
					}
					t.Skipf("online ext4 growth needs CAP_SYS_RESOURCE, which this machine lacks: %v", err)
				}
				if err != nil {
					t.Fatal(err)
				}
				if size != tt.to {
					t.Errorf("NodeExpandVolume reports %d bytes, want %d", size, tt.to)
				}
			} else {
				detachAll(t, c, v, target)
				target = attachAndPublish(t, c, v, dir, "pod")
			}
			after := sizeAt(t, v, target)
			if after-before < (tt.to-tt.from)*9/10 {
				t.Errorf("the pod sees %d bytes after growing from %d to %d (was %d)", after, tt.from, tt.to, before)
			}
			if err := lifecycle.Check(v, target, p); err != nil {
				t.Fatalf("after the growth: %v", err)
			}
		})
	}
}

// sizeAt is the size a pod sees: its filesystem's, or its device's.
func sizeAt(t *testing.T, v *lifecycle.Volume, target string) int64 {
	t.Helper()
	if v.Block() {
		out, err := runOutput("blockdev", "--getsize64", target)
		if err != nil {
			t.Fatalf("blockdev --getsize64 %s: %v", target, err)
		}
		var n int64
		if _, err := fmt.Sscan(strings.TrimSpace(out), &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	return statfsBytes(t, target)
}

func statfsBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks) * st.Frsize
}

func filesystemType(t *testing.T, mountPoint string) string {
	t.Helper()
	out, err := runOutput("findmnt", "-n", "-o", "FSTYPE", "--mountpoint", mountPoint)
	if err != nil {
		t.Fatalf("findmnt %s: %v", mountPoint, err)
	}
	return strings.TrimSpace(out)
}
