package blockdev

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeProc builds a /proc of processes whose descriptors link where the
// map says (pid -> fd targets) and whose comm is name.
func fakeProc(t *testing.T, procs map[string][]string, names map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for pid, targets := range procs {
		fdDir := filepath.Join(root, pid, "fd")
		if err := os.MkdirAll(fdDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, target := range targets {
			if err := os.Symlink(target, filepath.Join(fdDir, string(rune('0'+i)))); err != nil {
				t.Fatal(err)
			}
		}
		if name, ok := names[pid]; ok {
			if err := os.WriteFile(filepath.Join(root, pid, "comm"), []byte(name+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

func TestOpenersByPath(t *testing.T) {
	root := fakeProc(t, map[string][]string{
		"4242": {"/dev/null", "/dev/loop3"},   // an orphaned mkfs
		"77":   {"/dev/loop30", "/dev/pts/0"}, // another device whose name starts alike
		"12":   {"/dev/loop3"},                // holds it too; its comm is unreadable
	}, map[string]string{"4242": "mkfs.ext4", "77": "bash"})
	// Entries that are no process, and a process that exited (no fd).
	if err := os.Symlink("4242", filepath.Join(root, "self")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "99"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := openers(root, "/dev/loop3", 0)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b Opener) int { return a.PID - b.PID })
	want := []Opener{{PID: 12}, {PID: 4242, Command: "mkfs.ext4"}}
	if !slices.Equal(got, want) {
		t.Fatalf("openers = %v, want %v", got, want)
	}
	if got[1].String() != "pid 4242 (mkfs.ext4)" || got[0].String() != "pid 12" {
		t.Fatalf("String() = %q, %q", got[1], got[0])
	}
	if none, err := openers(root, "/dev/loop4", 0); err != nil || len(none) != 0 {
		t.Fatalf("openers of a device nobody holds = %v, %v", none, err)
	}
}

// A descriptor that names the device by another path (a container's /dev,
// /dev/block/7:3) is found by its device number.
func TestOpenersByDeviceNumber(t *testing.T) {
	dev, rdev := anyBlockDevice(t)
	root := fakeProc(t, map[string][]string{"31": {dev}}, map[string]string{"31": "fsck.ext4"})
	got, err := openers(root, "/dev/another-name", rdev)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []Opener{{PID: 31, Command: "fsck.ext4"}}) {
		t.Fatalf("openers = %v, want pid 31", got)
	}
}

func TestOpenersRefusesWhatIsNoBlockDevice(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{file, filepath.Join(t.TempDir(), "gone")} {
		if got, err := Openers("/proc", path); err == nil {
			t.Errorf("Openers(%s) = %v, nil; want an error", path, got)
		}
	}
}

// anyBlockDevice finds a block device node to stat (never to open), or
// skips.
func anyBlockDevice(t *testing.T) (string, uint64) {
	t.Helper()
	entries, _ := os.ReadDir("/dev")
	for _, e := range entries {
		var st unix.Stat_t
		p := filepath.Join("/dev", e.Name())
		if unix.Stat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK {
			return p, st.Rdev
		}
	}
	t.Skip("no block device node under /dev to stat")
	return "", 0
}
