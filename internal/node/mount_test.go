package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/command/commandtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

func TestUnescapeOctal(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/plain/path", "/plain/path"},
		{`/pods/my\040vol`, "/pods/my vol"},
		{`/a\011b`, "/a\tb"},
		{`/a\012b`, "/a\nb"},
		{`/back\134slash`, `/back\slash`},
		// An escaped backslash followed by digits is unescaped once only.
		{`/x\134040y`, `/x\040y`},
		{`\040\040`, "  "},
		{`/deleted\040(deleted)`, "/deleted (deleted)"},
		// Not an escape: kept as it is.
		{`/short\04`, `/short\04`},
		{`/trailing\`, `/trailing\`},
		{`/notoctal\089`, `/notoctal\089`},
		{`/toolarge\777`, `/toolarge\777`},
	}
	for _, tc := range tests {
		if got := unescapeOctal(tc.in); got != tc.want {
			t.Errorf("unescapeOctal(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// mountTable is a fake /proc/self/mountinfo the test rewrites.
type mountTable struct {
	t     *testing.T
	path  string
	lines []string
}

func newMountTable(t *testing.T, lines ...string) *mountTable {
	m := &mountTable{t: t, path: filepath.Join(t.TempDir(), "mountinfo"), lines: lines}
	m.write()
	return m
}

func (m *mountTable) write() {
	writeMountInfo(m.t, m.path, strings.Join(m.lines, "\n")+"\n")
}

const rootMount = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro"

// escape writes a path the way the kernel does in mountinfo.
func escape(p string) string {
	return strings.NewReplacer(" ", `\040`, "\t", `\011`, "\n", `\012`, `\`, `\134`).Replace(p)
}

// realDir returns a fresh directory with symlinks resolved, as the mount
// table would show it.
func realDir(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	r, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestMountsParsesAndUnescapes(t *testing.T) {
	target := realDir(t, "my vol")
	table := newMountTable(t,
		rootMount,
		"100 22 7:3 / "+escape(target)+" ro,nosuid,relatime shared:50 - xfs /dev/loop3 ro,nouuid,attr2",
		"101 100 7:3 /sub\\040dir /pods/x rw master:50 - xfs /dev/loop3 rw,nouuid",
	)
	d := NewLinuxHost(nil)
	d.mountInfoPath = table.path

	mounts, err := d.Mounts()
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 3 {
		t.Fatalf("got %d mounts, want 3: %+v", len(mounts), mounts)
	}
	m := mounts[1]
	want := Mount{ID: 100, Major: 7, Minor: 3, Root: "/", Source: "/dev/loop3", MountPoint: target, FsType: "xfs", Options: []string{"ro", "nosuid", "relatime"}}
	if m.ID != want.ID || m.Major != want.Major || m.Minor != want.Minor || m.Root != want.Root || m.Source != want.Source ||
		m.MountPoint != want.MountPoint || m.FsType != want.FsType || !slices.Equal(m.Options, want.Options) {
		t.Errorf("mount = %+v\nwant    %+v", m, want)
	}
	if !m.ReadOnly() || mounts[2].ReadOnly() {
		t.Errorf("ReadOnly: %v for %q, %v for %q", m.ReadOnly(), m.Options, mounts[2].ReadOnly(), mounts[2].Options)
	}
	if mounts[2].Root != "/sub dir" {
		t.Errorf("root = %q, want %q", mounts[2].Root, "/sub dir")
	}

	got, err := d.MountAt(target)
	if err != nil {
		t.Fatal(err)
	}
	if got == nil || got.ID != 100 {
		t.Errorf("MountAt(%q) = %+v, want mount 100", target, got)
	}
	if got, err := d.MountAt(filepath.Dir(target)); err != nil || got != nil {
		t.Errorf("MountAt(parent) = %+v, %v; want nil: the parent is not a mount point", got, err)
	}
}

func TestMountAtTopOfStackAndThroughSymlink(t *testing.T) {
	target := realDir(t, "globalmount")
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	table := newMountTable(t,
		rootMount,
		"100 22 7:3 / "+target+" rw - ext4 /dev/loop3 rw",
		"101 100 0:45 / "+target+" rw - tmpfs tmpfs rw",
	)
	d := NewLinuxHost(nil)
	d.mountInfoPath = table.path
	for _, p := range []string{target, target + "/", link} {
		m, err := d.MountAt(p)
		if err != nil {
			t.Fatal(err)
		}
		if m == nil || m.ID != 101 {
			t.Errorf("MountAt(%q) = %+v, want the top-most mount 101", p, m)
		}
	}
}

func TestMountsUnreadable(t *testing.T) {
	d := NewLinuxHost(nil)
	d.mountInfoPath = filepath.Join(t.TempDir(), "missing")
	if _, err := d.Mounts(); err == nil || !strings.Contains(err.Error(), d.mountInfoPath) {
		t.Errorf("Mounts() = %v, want an error naming %s", err, d.mountInfoPath)
	}
	writeMountInfo(t, d.mountInfoPath, "not a mountinfo line\n")
	if _, err := d.MountAt("/"); err == nil {
		t.Error("a malformed mount table must be an error")
	}
}

func TestUnmount(t *testing.T) {
	const target = "/pods/uid/volumes/kubernetes.io~csi/pv/mount"
	tests := []struct {
		name      string
		stacked   int
		fail      error // the first unmount fails with this
		wantCalls int
		wantKind  error
		wantErr   []string
	}{
		{name: "not mounted: one call, fine", wantCalls: 1},
		{name: "one mount", stacked: 1, wantCalls: 2},
		{name: "stacked mounts: one unmount per layer", stacked: 3, wantCalls: 4},
		{name: "busy: precondition, nothing forced", stacked: 2, fail: unix.EBUSY, wantCalls: 1, wantKind: errdefs.ErrPrecondition, wantErr: []string{"still in use", target}},
		{name: "path gone: fine", fail: unix.ENOENT, wantCalls: 1},
		{name: "other failure: error names the target", stacked: 1, fail: unix.EPERM, wantCalls: 1, wantErr: []string{"unmount " + target, "operation not permitted"}},
		{name: "a stack that never ends: bounded", stacked: 100, wantCalls: maxStackedMounts + 1, wantErr: []string{"still mounted after"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := scriptedHost(t) // no commands at all
			k := d.kernel.(*FakeKernelMounts)
			k.Stacked[target] = tc.stacked
			if tc.fail != nil {
				k.Fail["unmount "+target] = tc.fail
			}
			err := d.Unmount(context.Background(), target)
			if got := len(k.Calls); got != tc.wantCalls {
				t.Errorf("%d unmount calls (%v), want %d", got, k.Calls, tc.wantCalls)
			}
			if tc.wantKind == nil && len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Unmount: %v", err)
				}
				if k.Stacked[target] != 0 {
					t.Errorf("%d mounts left at the target", k.Stacked[target])
				}
				return
			}
			if err == nil {
				t.Fatal("Unmount succeeded, want an error")
			}
			if tc.wantKind != nil && !errors.Is(err, tc.wantKind) {
				t.Errorf("error %q is not of kind %q", err, tc.wantKind)
			}
			if tc.wantKind == nil && errors.Is(err, errdefs.ErrPrecondition) {
				t.Errorf("error %q must not be a precondition failure", err)
			}
			for _, s := range tc.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestBindMount(t *testing.T) {
	const src, dst = "/staging/globalmount", "/pods/uid/volumes/kubernetes.io~csi/pv/mount"
	// A read-only remount must keep the bind's other per-mount flags.
	const keptFlags = unix.ST_NOSUID | unix.ST_NODEV | unix.ST_RELATIME
	roFlags := fmt.Sprintf("remount-ro %s flags=%#x", dst, unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_RELATIME)
	tests := []struct {
		name      string
		readOnly  bool
		fail      map[string]error
		wantCalls []string
		wantErr   []string
	}{
		{name: "read-write: one bind", wantCalls: []string{"bind " + src + " " + dst}},
		{
			// The kernel ignores MS_RDONLY on the bind itself; it takes a remount.
			name: "read-only: bind, then remount read-only keeping nosuid,nodev,relatime", readOnly: true,
			wantCalls: []string{"bind " + src + " " + dst, roFlags},
		},
		{
			name: "bind fails: no remount", readOnly: true,
			fail:      map[string]error{"bind " + src + " " + dst: unix.ENOENT},
			wantCalls: []string{"bind " + src + " " + dst},
			wantErr:   []string{"bind " + src + " on " + dst, "no such file"},
		},
		{
			name: "remount fails: error names the target", readOnly: true,
			fail:      map[string]error{roFlags: unix.EACCES},
			wantCalls: []string{"bind " + src + " " + dst, roFlags},
			wantErr:   []string{"make " + dst + " read-only", "permission denied"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := scriptedHost(t)
			k := d.kernel.(*FakeKernelMounts)
			k.StatfsFlags = keptFlags
			for call, err := range tc.fail {
				k.Fail[call] = err
			}
			err := d.BindMount(context.Background(), src, dst, tc.readOnly)
			if !slices.Equal(k.Calls, tc.wantCalls) {
				t.Errorf("calls:\n got  %q\n want %q", k.Calls, tc.wantCalls)
			}
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("BindMount succeeded, want an error")
			}
			for _, s := range tc.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestMountDevice(t *testing.T) {
	d, _ := scriptedHost(t,
		commandtest.Expect("mount", "-t", "xfs", "-o", "nouuid,noatime,ro", "/dev/loop3", "/staging"),
		commandtest.Expect("mount", "-t", "ext4", "/dev/loop4", "/staging2"),
	)
	ctx := context.Background()
	if err := d.MountDevice(ctx, "/dev/loop3", "/staging", "xfs", []string{"nouuid", "noatime", "ro"}); err != nil {
		t.Fatal(err)
	}
	if err := d.MountDevice(ctx, "/dev/loop4", "/staging2", "ext4", nil); err != nil {
		t.Fatal(err)
	}
}

func TestIsMountOf(t *testing.T) {
	tests := []struct {
		name string
		m    Mount
		want bool
	}{
		{"same device number", Mount{Major: 7, Minor: 3, Source: "/dev/other"}, true},
		// btrfs mounts carry an anonymous device number.
		{"btrfs: anonymous number, same source", Mount{Major: 0, Minor: 52, Source: "/dev/loop3"}, true},
		{"other device", Mount{Major: 7, Minor: 4, Source: "/dev/loop4"}, false},
		{"same minor, other major", Mount{Major: 8, Minor: 3, Source: "/dev/sda3"}, false},
	}
	for _, tc := range tests {
		if got := tc.m.IsMountOf("/dev/loop3", 7, 3); got != tc.want {
			t.Errorf("%s: IsMountOf = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestResolve(t *testing.T) {
	realPath := realDir(t, "real")
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(realPath, link); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ in, want string }{
		{link, realPath},
		{link + "/missing", realPath + "/missing"}, // a missing leaf under a symlinked dir
		{"/nonexistent/a/../b/", "/nonexistent/b"},
	}
	for _, tc := range tests {
		if got := Resolve(tc.in); got != tc.want {
			t.Errorf("Resolve(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestRemoveMountPoint(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	file := filepath.Join(dir, "blockfile")
	full := filepath.Join(dir, "full")
	for _, d := range []string{empty, full} {
		if err := os.Mkdir(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{file, filepath.Join(full, "data")} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{empty, file, filepath.Join(dir, "missing")} {
		if err := removeMountPoint(realFiles, "target_path", p); err != nil {
			t.Errorf("RemoveMountPoint(%q): %v", p, err)
		}
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%q still exists", p)
		}
	}
	// A directory with content is never removed recursively: it may be a
	// volume whose unmount did not happen.
	if err := removeMountPoint(realFiles, "target_path", full); err == nil {
		t.Error("RemoveMountPoint of a non-empty directory succeeded")
	}
	if _, err := os.Stat(filepath.Join(full, "data")); err != nil {
		t.Errorf("content of a non-empty mount point was touched: %v", err)
	}
}
