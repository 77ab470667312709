//go:build root

package node

// Filesystem growth on real loop devices with the real tools. Root and the
// programs hack/install-deps.sh installs are needed; without them the tests
// skip, naming what is missing. Cleanup order: see device_test.go.

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// growDevice makes file newSize bytes and tells the loop device dev, as
// the loop attacher's Refresh does.
func growDevice(t *testing.T, dev, file string, newSize int64) {
	t.Helper()
	if err := os.Truncate(file, newSize); err != nil {
		t.Fatal(err)
	}
	if _, err := setupRunner.Run(context.Background(), "losetup", "--set-capacity", dev); err != nil {
		t.Fatalf("refresh %s: %v", dev, err)
	}
	if got, err := BlockDeviceSize(dev); err != nil || got != newSize {
		t.Fatalf("after losetup --set-capacity, %s is %d bytes (%v), want %d", dev, got, err, newSize)
	}
}

// writeRandomFile writes size random bytes to path and returns their hash.
func writeRandomFile(t *testing.T, path string, size int) [32]byte {
	t.Helper()
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return fileSHA256(t, path)
}

func stage(t *testing.T, d *LinuxHost, dev, target, fsName string) {
	t.Helper()
	fs := mustFS(t, fsName)
	if _, err := stageFilesystem(context.Background(), d, FormatRequest{Device: dev, Filesystem: fs}, target, fs.MountOptions(nil, false), func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

func wantNeedsGrow(t *testing.T, d *LinuxHost, dev, fs string, want bool) {
	t.Helper()
	got, err := needsGrow(context.Background(), d, dev, fs)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		fsBytes, _ := d.FilesystemSize(context.Background(), dev, fs)
		devBytes, _ := BlockDeviceSize(dev)
		t.Fatalf("NeedsGrow(%s on %s) = %v, want %v (filesystem %d bytes, device %d)", fs, dev, got, want, fsBytes, devBytes)
	}
}

// A volume expanded while staged (xfs, btrfs, and ext4 where the node
// plugin has CAP_SYS_RESOURCE) or while unstaged (ext4, grown offline at
// the next stage): the filesystem fills the bigger device afterwards, a
// second grow changes nothing, and the data written before reads back.
func TestRealGrowFilesystem(t *testing.T) {
	testutil.RequireRoot(t, "attach loop devices and mount them")
	testutil.RequireCommands(t, "losetup", "blkid", "mount", "umount")
	const grownBy = 64 * mib
	tests := []struct {
		fs      string
		size    int64
		mounted bool
		tools   []string
	}{
		{"ext4", 64 * mib, false, []string{"mkfs.ext4", "dumpe2fs", "e2fsck", "resize2fs"}},
		{"ext4", 64 * mib, true, []string{"mkfs.ext4", "dumpe2fs", "resize2fs"}},
		{"xfs", 512 * mib, true, []string{"mkfs.xfs", "xfs_info", "xfs_growfs"}},
		{"btrfs", 256 * mib, true, []string{"mkfs.btrfs", "btrfs"}},
	}
	for _, tc := range tests {
		name := tc.fs + " offline"
		if tc.mounted {
			name = tc.fs + " online"
		}
		t.Run(name, func(t *testing.T) {
			testutil.RequireCommands(t, tc.tools...)
			ctx := context.Background()
			d, ran := realHost()
			dev, file := loopDevice(t, tc.size)
			target := mountPoint(t, d, "globalmount")
			stage(t, d, dev, target, tc.fs)
			sum := writeRandomFile(t, filepath.Join(target, "data"), 3*mib+17)
			before, err := UsageOf(target)
			if err != nil {
				t.Fatal(err)
			}
			mountPath := target
			if !tc.mounted {
				mustUnmount(t, d, target)
				mountPath = ""
			}
			wantNeedsGrow(t, d, dev, tc.fs, false)
			oldSize, err := d.FilesystemSize(ctx, dev, tc.fs)
			if err != nil {
				t.Fatal(err)
			}
			// Nothing to grow yet: every tool leaves the filesystem as it is
			// and succeeds, resize2fs even without CAP_SYS_RESOURCE (it
			// stops before asking the kernel).
			if err := d.GrowFilesystem(ctx, dev, tc.fs, mountPath); err != nil {
				t.Fatalf("GrowFilesystem before the device grew: %v", err)
			}
			if got, err := d.FilesystemSize(ctx, dev, tc.fs); err != nil || got != oldSize {
				t.Fatalf("a grow with nothing to grow changed the filesystem to %d bytes (%v), from %d", got, err, oldSize)
			}

			newSize := tc.size + grownBy
			growDevice(t, dev, file, newSize)
			wantNeedsGrow(t, d, dev, tc.fs, true)

			ran.reset()
			err = d.GrowFilesystem(ctx, dev, tc.fs, mountPath)
			if tc.fs == "ext4" && tc.mounted && err != nil {
				// What this VM does: the kernel refuses the resize ioctl
				// with EPERM to a process without CAP_SYS_RESOURCE.
				testutil.WantKind(t, err, errdefs.ErrPrecondition, "online ext4 growth needs CAP_SYS_RESOURCE", "unstage and restage", "Permission denied to resize filesystem")
				if got, err := d.FilesystemSize(ctx, dev, tc.fs); err != nil || got != oldSize {
					t.Errorf("after the refused grow the filesystem is %d bytes (%v), want the old %d", got, err, oldSize)
				}
				if got := fileSHA256(t, filepath.Join(target, "data")); got != sum {
					t.Error("the data changed")
				}
				t.Skipf("online ext4 growth is not possible here: the node plugin's programs lack CAP_SYS_RESOURCE (%v)", err)
			}
			if err != nil {
				t.Fatalf("GrowFilesystem: %v\nran: %q", err, ran.all())
			}
			want := map[string][]string{
				"ext4 offline": {"e2fsck -f -p " + dev, "resize2fs " + dev},
				"ext4 online":  {"resize2fs " + dev},
				"xfs online":   {"xfs_growfs " + target},
				"btrfs online": {"btrfs filesystem resize max " + target},
			}[name]
			if got := ran.all(); !slices.Equal(got, want) {
				t.Errorf("GrowFilesystem ran %q, want %q", got, want)
			}

			grown, err := d.FilesystemSize(ctx, dev, tc.fs)
			if err != nil {
				t.Fatal(err)
			}
			if grown > newSize || newSize-grown > mustFS(t, tc.fs).MaxUnusedTail() {
				t.Errorf("after growing, the filesystem is %d bytes; the device is %d", grown, newSize)
			}
			wantNeedsGrow(t, d, dev, tc.fs, false)

			// Again: a filesystem that fills its device stays as it is.
			if err := d.GrowFilesystem(ctx, dev, tc.fs, mountPath); err != nil {
				t.Fatalf("second GrowFilesystem: %v", err)
			}
			if again, err := d.FilesystemSize(ctx, dev, tc.fs); err != nil || again != grown {
				t.Errorf("after a second grow the filesystem is %d bytes (%v), want %d still", again, err, grown)
			}

			if !tc.mounted {
				stage(t, d, dev, target, tc.fs)
			}
			after, err := UsageOf(target)
			if err != nil {
				t.Fatal(err)
			}
			if after.TotalBytes-before.TotalBytes < grownBy*3/4 {
				t.Errorf("statfs: %d bytes before, %d after growing the device by %d", before.TotalBytes, after.TotalBytes, grownBy)
			}
			if got := fileSHA256(t, filepath.Join(target, "data")); got != sum {
				t.Error("the data written before the grow reads back differently")
			}
		})
	}
}

// NodeExpandVolume may name a pod's read-only bind; xfs and btrfs grow
// through the read-write staging mount instead of failing with EROFS.
func TestRealGrowThroughReadOnlyBind(t *testing.T) {
	testutil.RequireRoot(t, "attach loop devices and mount them")
	testutil.RequireCommands(t, "losetup", "blkid", "mount", "umount")
	for _, tc := range []struct {
		fs    string
		size  int64
		tools []string
	}{
		{"xfs", 512 * mib, []string{"mkfs.xfs", "xfs_info", "xfs_growfs"}},
		{"btrfs", 256 * mib, []string{"mkfs.btrfs", "btrfs"}},
	} {
		t.Run(tc.fs, func(t *testing.T) {
			testutil.RequireCommands(t, tc.tools...)
			ctx := context.Background()
			d, ran := realHost()
			dev, file := loopDevice(t, tc.size)
			staging := mountPoint(t, d, "globalmount")
			pod := mountPoint(t, d, "pod")
			stage(t, d, dev, staging, tc.fs)
			if err := d.BindMount(ctx, staging, pod, true); err != nil {
				t.Fatal(err)
			}
			growDevice(t, dev, file, tc.size+32*mib)
			ran.reset()
			if err := d.GrowFilesystem(ctx, dev, tc.fs, pod); err != nil {
				t.Fatalf("GrowFilesystem through the read-only bind: %v", err)
			}
			if got := ran.all(); len(got) != 1 || !strings.HasSuffix(got[0], " "+staging) {
				t.Errorf("ran %q, want the grow through %s", got, staging)
			}
			wantNeedsGrow(t, d, dev, tc.fs, false)
		})
	}
}

// An ext4 that e2fsck -p will not repair on its own is not grown, and the
// error says what e2fsck found.
func TestRealGrowExt4RefusesDamagedFilesystem(t *testing.T) {
	testutil.RequireRoot(t, "attach loop devices")
	testutil.RequireCommands(t, "losetup", "blkid", "mkfs.ext4", "debugfs", "dumpe2fs", "e2fsck", "resize2fs")
	ctx := context.Background()
	d, ran := realHost()
	dev, file := loopDevice(t, 64*mib)
	if _, err := ensureFilesystem(ctx, d, FormatRequest{Device: dev, Filesystem: mustFS(t, "ext4")}); err != nil {
		t.Fatal(err)
	}
	// Clear the root directory's inode: "Root inode is not a directory",
	// which preen mode leaves to a person.
	if _, err := setupRunner.Run(ctx, "debugfs", "-w", "-R", "clri <2>", dev); err != nil {
		t.Fatal(err)
	}
	growDevice(t, dev, file, 128*mib)
	ran.reset()
	err := d.GrowFilesystem(ctx, dev, "ext4", "")
	testutil.WantKind(t, err, errdefs.ErrPrecondition, dev, "exit 4", "Root inode is not a directory", "UNEXPECTED INCONSISTENCY")
	if got := ran.all(); !slices.Equal(got, []string{"e2fsck -f -p " + dev}) {
		t.Errorf("ran %q, want e2fsck only", got)
	}
	if size, err := d.FilesystemSize(ctx, dev, "ext4"); err != nil || size != 64*mib {
		t.Errorf("the refused filesystem is %d bytes (%v), want 64 MiB still", size, err)
	}
}

// The measured tails (TestNeedsGrowMeasuredTails), checked again with the
// real mkfs on the sizes where they are largest: NeedsGrow is false on the
// fresh filesystem and true once the device has grown by 16 MiB.
func TestRealFreshFilesystemNeedsNoGrow(t *testing.T) {
	testutil.RequireRoot(t, "attach loop devices")
	testutil.RequireCommands(t, "losetup", "blkid")
	sizes := map[string][]int64{
		"ext4":  {64, 513, 642, 2048},
		"xfs":   {300, 2047},
		"btrfs": {109, 2048},
	}
	for _, fs := range blockdev.SupportedFilesystems() {
		for _, mibs := range sizes[fs] {
			t.Run(fmt.Sprintf("%s/%dMiB", fs, mibs), func(t *testing.T) {
				testutil.RequireCommands(t, "mkfs."+fs)
				ctx := context.Background()
				d, _ := realHost()
				dev, file := loopDevice(t, mibs*mib)
				if _, err := ensureFilesystem(ctx, d, FormatRequest{Device: dev, Filesystem: mustFS(t, fs)}); err != nil {
					t.Fatal(err)
				}
				wantNeedsGrow(t, d, dev, fs, false)
				growDevice(t, dev, file, (mibs+16)*mib)
				wantNeedsGrow(t, d, dev, fs, true)
			})
		}
	}
}
