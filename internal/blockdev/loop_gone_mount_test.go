//go:build root

package blockdev

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// A loop device bound by a process whose mount of the file is gone, as a
// node plugin container leaves its devices when it restarts: sysfs shows
// the path below that mount's root, and the real losetup still finds the
// device as the file's, by device and inode (issue 31: a restarted plugin
// saw every loop volume "bound to \"/pvc-….img\", not to volume …").
func TestLosetupDeviceBoundThroughAGoneMount(t *testing.T) {
	testutil.RequireRoot(t, "binds a loop device in a mount namespace of its own")
	testutil.RequireCommands(t, "losetup", "unshare", "mount")
	pool := t.TempDir()
	file := filepath.Join(pool, "pvc-gone-mount.img")
	other := filepath.Join(pool, "pvc-other.img")
	sparseFile(t, other)
	dev := bindThroughGoneMount(t, pool, file)

	l := newLosetup(command.New(nil, nil))
	d, err := l.Get(t.Context(), dev)
	if err != nil {
		t.Fatal(err)
	}
	if d.BackingFile != "/pvc-gone-mount.img" {
		t.Skipf("sysfs shows %s bound to %q, not the path below the gone mount's root this test is about", dev, d.BackingFile)
	}
	if ok, err := l.Resolve(d, file); err != nil || !ok || d.BackingFile != file {
		t.Errorf("Resolve(%s, %s) = %t, %v, BackingFile %q; want true, the file", dev, file, ok, err, d.BackingFile)
	}
	// Same name elsewhere, or another file of the pool: never by name alone.
	for _, f := range []string{filepath.Join(t.TempDir(), "pvc-gone-mount.img"), other} {
		_ = os.WriteFile(f, nil, 0o600)
		d, _ := l.Get(t.Context(), dev)
		if ok, err := l.Resolve(d, f); err != nil || ok {
			t.Errorf("Resolve(%s, %s) = %t, %v; want false", dev, f, ok, err)
		}
	}
	bound, err := l.BoundTo(t.Context(), file)
	if err != nil || len(bound) != 1 || bound[0].Path != dev || bound[0].BackingFile != file {
		t.Errorf("BoundTo(%s) = %+v, %v; want %s", file, bound, err, dev)
	}
	if bound, err := l.BoundTo(t.Context(), other); err != nil || len(bound) != 0 {
		t.Errorf("BoundTo(%s) = %+v, %v; want none", other, bound, err)
	}
	// A mount of the file itself (a FUSE export over a file) shows as "/".
	fileMount, exported := filepath.Join(t.TempDir(), "export"), filepath.Join(pool, "pvc-exported.img")
	if err := os.WriteFile(fileMount, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sparseFile(t, exported)
	out, err := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount --bind "$2" "$1" && losetup --find --show "$1"`, "sh", fileMount, exported).CombinedOutput()
	if err != nil {
		t.Fatalf("bind a loop device through a mount of the file itself: %v: %s", err, out)
	}
	fileDev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "--detach", fileDev).Run() })
	if d, err := l.Get(t.Context(), fileDev); err != nil || d.BackingFile != "/" {
		t.Errorf("Get(%s) = %+v, %v; want the backing file shown as \"/\"", fileDev, d, err)
	} else if ok, err := l.Resolve(d, exported); err != nil || !ok || d.BackingFile != exported {
		t.Errorf("Resolve(%s, %s) = %t, %v; want true", fileDev, exported, ok, err)
	} else if ok, err := l.Resolve(&LoopDevice{Path: fileDev, BackingFile: "/"}, file); err != nil || ok {
		t.Errorf("Resolve(%s, %s) = %t, %v; want false (another file)", fileDev, file, ok, err)
	}

	under, err := l.BoundUnder(t.Context(), pool)
	found := false
	for _, u := range under {
		found = found || u.Path == dev && u.BackingFile == file
	}
	if err != nil || !found {
		t.Errorf("BoundUnder(%s) = %+v, %v; want %s bound to %s among them", pool, under, err, dev, file)
	}
}

// A device bound through a gone mount whose file sysfs shows "(deleted)"
// while the file is there, as rbd-fuse's file shows once rbd-fuse has
// answered a lookup ENOENT under load (the kernel drops the dentry the
// device holds; issue 31: an upgrade's NodeUnstage missed such a device
// and left it and its rbd-fuse mount behind). Made here with hard links:
// the file unlinked and linked back, the same inode under the same name.
// The same inode is the file's; another file of that name is not.
func TestLosetupDeletedDentryOfALiveFile(t *testing.T) {
	testutil.RequireRoot(t, "binds a loop device in a mount namespace of its own")
	testutil.RequireCommands(t, "losetup", "unshare", "mount")
	pool := t.TempDir()
	file, keep := filepath.Join(pool, "csi-vol-relinked"), filepath.Join(pool, "keep")
	dev := bindThroughGoneMount(t, pool, file)
	for _, step := range []func() error{
		func() error { return os.Link(file, keep) },
		func() error { return os.Remove(file) },
		func() error { return os.Link(keep, file) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}

	l := newLosetup(command.New(nil, nil))
	d, err := l.Get(t.Context(), dev)
	if err != nil {
		t.Fatal(err)
	}
	if d.BackingFile != "/csi-vol-relinked" || !d.Deleted {
		t.Skipf("sysfs shows %s bound to %q (deleted: %t), not the gone mount's deleted path this test is about", dev, d.BackingFile, d.Deleted)
	}
	if ok, err := l.Resolve(d, file); err != nil || !ok || d.BackingFile != file || d.Deleted {
		t.Errorf("Resolve(%s, %s) = %t, %v, %+v; want true, the file, not deleted", dev, file, ok, err, d)
	}
	bound, err := l.BoundTo(t.Context(), file)
	if err != nil || len(bound) != 1 || bound[0].Path != dev || bound[0].Deleted {
		t.Errorf("BoundTo(%s) = %+v, %v; want %s, not deleted", file, bound, err, dev)
	}
	// Another file of that name: the device's inode is no longer there.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	d, _ = l.Get(t.Context(), dev)
	if ok, err := l.Resolve(d, file); err != nil || ok {
		t.Errorf("Resolve(%s, %s) after the file was replaced = %t, %v; want false", dev, file, ok, err)
	}
	if bound, err := l.BoundTo(t.Context(), file); err != nil || len(bound) != 0 {
		t.Errorf("BoundTo(%s) after the file was replaced = %+v, %v; want none", file, bound, err)
	}
}

// sparseFile makes an 8 MiB sparse file at path.
func sparseFile(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 8<<20); err != nil {
		t.Fatal(err)
	}
}

// bindThroughGoneMount makes file (in pool) and binds a loop device to it
// through pool bind-mounted at another path, in a private mount namespace
// that ends with the command: the view of a container of a hostPath,
// gone once it stops. The device is detached when the test ends.
func bindThroughGoneMount(t *testing.T, pool, file string) string {
	t.Helper()
	sparseFile(t, file)
	out, err := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mkdir -p "$1" && mount --bind "$2" "$1" && losetup --find --show "$1/$3"`, "sh",
		filepath.Join(t.TempDir(), "container-view"), pool, filepath.Base(file)).CombinedOutput()
	if err != nil {
		t.Skipf("cannot bind a loop device in a mount namespace of its own here: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "--detach", dev).Run() })
	return dev
}
