package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// pathTree is a test's allowed root and a directory outside it, with a few
// symlinks between them.
type pathTree struct {
	root, outside string
}

func newPathTree(t *testing.T) pathTree {
	t.Helper()
	base := t.TempDir()
	tr := pathTree{root: filepath.Join(base, "kubelet"), outside: filepath.Join(base, "outside")}
	for _, d := range []string{tr.root, tr.outside, filepath.Join(tr.root, "pods"), filepath.Join(tr.outside, "etc")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(t, filepath.Join(tr.outside, "etc", "passwd"), "root:x:0:0\n")
	mustSymlink(t, filepath.Join(tr.outside, "etc"), filepath.Join(tr.root, "escape"))
	mustSymlink(t, filepath.Join(tr.root, "pods"), filepath.Join(tr.root, "pods-link"))
	mustSymlink(t, filepath.Join(tr.outside, "missing"), filepath.Join(tr.root, "dangling"))
	mustSymlink(t, filepath.Join(tr.outside, "etc", "passwd"), filepath.Join(tr.root, "pods", "target-link"))
	mustWrite(t, filepath.Join(tr.root, "pods", "file"), "data")
	return tr
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestPathGuardConfine(t *testing.T) {
	tr := newPathTree(t)
	g, err := NewPathGuard(tr.root)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		path string
		want string // the confined path; "" when refused
		kind error
		msg  []string
	}{
		{name: "below the root", path: tr.root + "/pods/p1/volumes/mount", want: tr.root + "/pods/p1/volumes/mount"},
		{name: "a missing chain of parents", path: tr.root + "/a/b/c/d", want: tr.root + "/a/b/c/d"},
		{name: "a symlinked parent inside the root", path: tr.root + "/pods-link/p1", want: tr.root + "/pods/p1"},
		{name: "the root itself", path: tr.root, kind: errdefs.ErrInvalidArgument, msg: []string{"not below an allowed root", tr.root}},
		{name: "outside the root", path: tr.outside + "/etc/passwd", kind: errdefs.ErrInvalidArgument, msg: []string{"target_path", tr.outside + "/etc/passwd", tr.root}},
		{name: "a root's sibling with the same prefix", path: tr.root + "-other/x", kind: errdefs.ErrInvalidArgument},
		{name: "a symlinked parent escaping the root", path: tr.root + "/escape/passwd", kind: errdefs.ErrInvalidArgument, msg: []string{"once its symlinks are resolved", tr.outside + "/etc/passwd"}},
		{name: "below a dangling symlink", path: tr.root + "/dangling/x", kind: errdefs.ErrPrecondition, msg: []string{"symlink to a path that does not exist"}},
		{name: "a symlink in the path's place", path: tr.root + "/pods/target-link", kind: errdefs.ErrPrecondition, msg: []string{"is a symlink", "never follows"}},
		{name: "below a regular file", path: tr.root + "/pods/file/x", kind: errdefs.ErrPrecondition, msg: []string{"not a directory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := g.Confine("target_path", tt.path)
			if tt.kind == nil {
				if err != nil || got != tt.want {
					t.Fatalf("Confine(%q) = %q, %v; want %q", tt.path, got, err, tt.want)
				}
				return
			}
			if !errors.Is(err, tt.kind) {
				t.Fatalf("Confine(%q) = %q, %v; want a %v error", tt.path, got, err, tt.kind)
			}
			for _, m := range tt.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
		})
	}
	if data, err := os.ReadFile(filepath.Join(tr.outside, "etc", "passwd")); err != nil || string(data) != "root:x:0:0\n" {
		t.Errorf("the file outside the root changed: %q, %v", data, err)
	}
}

// A root that is itself a symlink (a kubelet directory moved to another
// disk) confines the paths below its target.
func TestPathGuardRootIsASymlink(t *testing.T) {
	base := t.TempDir()
	real := filepath.Join(base, "data", "kubelet")
	if err := os.MkdirAll(real, 0o750); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "kubelet")
	mustSymlink(t, real, link)
	g, err := NewPathGuard(link)
	if err != nil {
		t.Fatal(err)
	}
	got, err := g.Confine("staging_target_path", link+"/plugins/x/globalmount")
	if err != nil || got != real+"/plugins/x/globalmount" {
		t.Fatalf("Confine = %q, %v; want %q", got, err, real+"/plugins/x/globalmount")
	}
}

func TestNewPathGuardRefuses(t *testing.T) {
	for _, roots := range [][]string{nil, {"relative"}, {"/"}, {"/tmp", "//"}} {
		if _, err := NewPathGuard(roots...); err == nil {
			t.Errorf("NewPathGuard(%q) accepted", roots)
		}
	}
}

// victim makes one kind of thing at path, and returns a function that
// fails the test unless it is still there exactly as made.
type victim struct {
	name string
	make func(t *testing.T, path string)
}

var victims = []victim{
	{"regular file with data", func(t *testing.T, p string) { mustWrite(t, p, "precious") }},
	{"empty regular file", func(t *testing.T, p string) { mustWrite(t, p, "") }},
	{"character device node", func(t *testing.T, p string) { mustMknod(t, p, unix.S_IFCHR, 1, 3) }},
	{"block device node", func(t *testing.T, p string) { mustMknod(t, p, unix.S_IFBLK, 7, 250) }},
	{"socket", func(t *testing.T, p string) {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrUnix{Name: p}); err != nil {
			t.Fatal(err)
		}
	}},
	{"named pipe", func(t *testing.T, p string) {
		if err := unix.Mkfifo(p, 0o600); err != nil {
			t.Fatal(err)
		}
	}},
	{"non-empty directory", func(t *testing.T, p string) {
		if err := os.Mkdir(p, 0o750); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, filepath.Join(p, "data"), "precious")
	}},
	{"empty directory", func(t *testing.T, p string) {
		if err := os.Mkdir(p, 0o750); err != nil {
			t.Fatal(err)
		}
	}},
}

func mustMknod(t *testing.T, path string, kind uint32, major, minor uint32) {
	t.Helper()
	testutil.RootOnlyCase(t, "make a device node (mknod)")
	if err := unix.Mknod(path, kind|0o600, int(unix.Mkdev(major, minor))); err != nil {
		t.Fatal(err)
	}
}

// snapshot describes what is at path, so a test can tell it is unchanged.
func snapshot(t *testing.T, path string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return "missing"
	}
	s := fmt.Sprintf("mode=%o ino=%d rdev=%d size=%d", st.Mode, st.Ino, st.Rdev, st.Size)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		data, _ := os.ReadFile(path)
		s += fmt.Sprintf(" data=%q", data)
	case unix.S_IFDIR:
		entries, _ := os.ReadDir(path)
		for _, e := range entries {
			s += " " + e.Name()
		}
	}
	return s
}

// realHelper runs a path helper on the real filesystem.
func realHelper(h func(Host, string, string) error) func(field, path string) error {
	return func(field, path string) error { return h(realFiles, field, path) }
}

// Each helper accepts exactly what the driver could have made and leaves
// everything else as it was.
func TestPathHelpersOnEveryKind(t *testing.T) {
	type outcome struct {
		ok      bool // nil error; otherwise FAILED_PRECONDITION
		removed bool // the path is gone afterwards
	}
	helpers := []struct {
		name string
		call func(field, path string) error
		want map[string]outcome // by victim; missing entries: refused, intact
	}{
		{"checkStagingPath", realHelper(checkStagingPath), map[string]outcome{
			"non-empty directory": {ok: true}, "empty directory": {ok: true},
		}},
		{"checkEmptyStagingPath", realHelper(checkEmptyStagingPath), map[string]outcome{
			"empty directory": {ok: true},
		}},
		{"prepareMountPoint", realHelper(prepareMountPoint), map[string]outcome{
			"empty directory": {ok: true},
		}},
		{"prepareDeviceTarget", realHelper(prepareDeviceTarget), map[string]outcome{
			"empty regular file": {ok: true},
		}},
		{"removeMountPoint", realHelper(removeMountPoint), map[string]outcome{
			"empty regular file": {ok: true, removed: true}, "empty directory": {ok: true, removed: true},
		}},
	}
	for _, h := range helpers {
		for _, v := range victims {
			t.Run(h.name+"/"+v.name, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "victim")
				v.make(t, path)
				before := snapshot(t, path)
				err := h.call("target_path", path)
				want := h.want[v.name]
				switch {
				case want.ok && err != nil:
					t.Fatalf("%s: %v, want success", h.name, err)
				case !want.ok && !errors.Is(err, errdefs.ErrPrecondition):
					t.Fatalf("%s = %v, want FAILED_PRECONDITION", h.name, err)
				case !want.ok && !strings.Contains(err.Error(), path):
					t.Errorf("error %q does not name the path", err)
				}
				after := snapshot(t, path)
				if want.removed {
					if after != "missing" {
						t.Errorf("%s left %s", h.name, after)
					}
				} else if after != before {
					t.Errorf("%s changed the victim: %s -> %s", h.name, before, after)
				}
			})
		}
	}
}

// What is missing is made: a mount point directory, or an empty file for
// a block device, with their parents.
func TestPrepareCreatesWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	mp := filepath.Join(dir, "pods", "p", "volumes", "mount")
	if err := prepareMountPoint(realFiles, "target_path", mp); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(mp); err != nil || !st.IsDir() {
		t.Fatalf("mount point: %v, %v", st, err)
	}
	dev := filepath.Join(dir, "publish", "pv", "pod-uid")
	if err := prepareDeviceTarget(realFiles, "target_path", dev); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(dev); err != nil || !st.Mode().IsRegular() || st.Size() != 0 {
		t.Fatalf("device target: %v, %v", st, err)
	}
	if err := checkStagingPath(realFiles, "staging_target_path", filepath.Join(dir, "missing")); err != nil {
		t.Errorf("CheckStagingPath of a missing path: %v", err)
	}
	if err := removeMountPoint(realFiles, "target_path", filepath.Join(dir, "missing")); err != nil {
		t.Errorf("RemoveMountPoint of a missing path: %v", err)
	}
}

// The stage record's name is only removed when it is a regular file.
func TestRemoveStageRecordOnlyRemovesAFile(t *testing.T) {
	staging := filepath.Join(t.TempDir(), "staging")
	if err := os.Mkdir(StageRecordPath(staging), 0o750); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(StageRecordPath(staging), "data"), "precious")
	if err := RemoveStageRecord(staging); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("RemoveStageRecord over a directory = %v, want FAILED_PRECONDITION", err)
	}
	if _, err := os.Stat(filepath.Join(StageRecordPath(staging), "data")); err != nil {
		t.Fatalf("the directory's content: %v", err)
	}
}

// A stage record replaces only a record (or the empty file a power loss
// can leave of one), never a file of that name the driver did not write.
func TestWriteStageRecordNeverReplacesData(t *testing.T) {
	dir := t.TempDir()
	rec := StageRecord{VolumeID: "loop/default/pvc-1", Device: "/dev/loop3", AccessType: "block"}
	tests := []struct {
		name    string
		before  func(path string)
		replace bool
	}{
		{"nothing there", func(string) {}, true},
		{"an earlier record", func(p string) { mustWrite(t, p, `{"version":1,"volumeID":"loop/default/pvc-1","device":"/dev/loop2"}`) }, true},
		{"an empty file", func(p string) { mustWrite(t, p, "") }, true},
		{"somebody's file", func(p string) { mustWrite(t, p, "precious") }, false},
		{"JSON that is no record", func(p string) { mustWrite(t, p, `{"name":"x"}`) }, false},
		{"a directory", func(p string) {
			if err := os.Mkdir(p, 0o750); err != nil {
				t.Fatal(err)
			}
		}, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			staging := filepath.Join(dir, fmt.Sprint(i))
			tt.before(StageRecordPath(staging))
			before := snapshot(t, StageRecordPath(staging))
			err := WriteStageRecord(staging, rec)
			if tt.replace {
				if err != nil {
					t.Fatal(err)
				}
				got, err := ReadStageRecord(staging)
				if err != nil || got.Device != "/dev/loop3" {
					t.Fatalf("record = %+v, %v", got, err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrPrecondition) {
				t.Fatalf("WriteStageRecord = %v, want FAILED_PRECONDITION", err)
			}
			if after := snapshot(t, StageRecordPath(staging)); after != before {
				t.Errorf("changed: %s -> %s", before, after)
			}
		})
	}
}
