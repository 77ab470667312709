package filestore

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/testutil"
)

// scratchSizes are at least what mkfs accepts and what the tests copy (the
// backing files are sparse, so they cost next to nothing).
var scratchSizes = map[string]int64{"xfs": 512 << 20, "btrfs": 256 << 20, "ext4": 256 << 20, "tmpfs": 256 << 20}

var mkfsArgs = map[string][]string{
	"xfs":   {"-q", "-m", "reflink=1"},
	"btrfs": {"-q"},
	"ext4":  {"-q", "-F"},
}

// scratchFS mounts a fresh filesystem of type fstype (xfs, btrfs, ext4 on a
// loop-backed file, or tmpfs) of size bytes (0: scratchSizes) and returns its
// mount point. The mount and its loop device go away when the test ends.
func scratchFS(t *testing.T, fstype string, size int64) string {
	t.Helper()
	testutil.RequireRoot(t, "mount a scratch "+fstype+" filesystem")
	dir := filepath.Join(t.TempDir(), "mnt-"+fstype)
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if size == 0 {
		size = scratchSizes[fstype]
	}
	source, flags, data := "spindle-test", uintptr(unix.MS_NOSUID|unix.MS_NODEV), ""
	if fstype == "tmpfs" {
		data = fmt.Sprintf("size=%d,mode=0750", size)
	} else {
		testutil.RequireCommands(t, "losetup", "mkfs."+fstype)
		file := filepath.Join(t.TempDir(), fstype+".fs")
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(file, size); err != nil {
			t.Fatal(err)
		}
		run(t, "mkfs."+fstype, append(mkfsArgs[fstype], file)...)
		source = strings.TrimSpace(run(t, "losetup", "--find", "--show", file))
		t.Cleanup(func() {
			if out, err := exec.Command("losetup", "--detach", source).CombinedOutput(); err != nil {
				t.Errorf("losetup --detach %s: %v: %s", source, err, out)
			}
		})
	}
	if err := unix.Mount(source, dir, fstype, flags, data); err != nil {
		t.Fatalf("mount %s %s on %s: %v", fstype, source, dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
	return dir
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

// allocated is how many bytes of the file the filesystem has allocated.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}
