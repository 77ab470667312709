package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

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
	mu    sync.Mutex
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

// popTop removes the last (top-most) entry, as a successful umount would.
func (m *mountTable) popTop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lines = m.lines[:len(m.lines)-1]
	m.write()
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
	d := New(nil)
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
	d := New(nil)
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
	d := New(nil)
	d.mountInfoPath = filepath.Join(t.TempDir(), "missing")
	if _, err := d.Mounts(); err == nil || !strings.Contains(err.Error(), d.mountInfoPath) {
		t.Errorf("Mounts() = %v, want an error naming %s", err, d.mountInfoPath)
	}
	writeMountInfo(t, d.mountInfoPath, "not a mountinfo line\n")
	if _, err := d.MountAt("/"); err == nil {
		t.Error("a malformed mount table must be an error")
	}
}

// umountResult is one scripted umount: how it exits, and whether the layer
// on top is gone from the mount table afterwards.
type umountResult struct {
	stderr string // empty: success
	popped bool
}

var umountOK = umountResult{popped: true}

func TestUnmount(t *testing.T) {
	tests := []struct {
		name string
		// layers are stacked at the target, bottom first; %s is the target.
		layers   []string
		umounts  []umountResult
		wantKind error
		wantErr  []string
	}{
		{
			name: "not mounted: nothing runs",
		},
		{
			name:    "one mount",
			layers:  []string{"7:3 / %s rw - ext4 /dev/loop3 rw"},
			umounts: []umountResult{umountOK},
		},
		{
			name:    "stacked mounts: one umount per layer",
			layers:  []string{"7:3 / %s rw - ext4 /dev/loop3 rw", "7:3 / %s rw - ext4 /dev/loop3 rw", "0:45 / %s rw - tmpfs tmpfs rw"},
			umounts: []umountResult{umountOK, umountOK, umountOK},
		},
		{
			// Someone else unmounted it between our read and our umount.
			name:    "umount says not mounted: tolerated",
			layers:  []string{"7:3 / %s rw - ext4 /dev/loop3 rw"},
			umounts: []umountResult{{stderr: "umount: %s: not mounted.", popped: true}},
		},
		{
			name:     "target is busy: precondition",
			layers:   []string{"7:3 / %s rw - ext4 /dev/loop3 rw", "7:3 / %s rw - ext4 /dev/loop3 rw"},
			umounts:  []umountResult{{stderr: "umount: %s: target is busy."}},
			wantKind: errdefs.ErrPrecondition,
			wantErr:  []string{"still in use", "target is busy"},
		},
		{
			name:    "other umount failure: error with stderr",
			layers:  []string{"7:3 / %s rw - ext4 /dev/loop3 rw"},
			umounts: []umountResult{{stderr: "umount: %s: must be superuser to unmount."}},
			wantErr: []string{"must be superuser"},
		},
		{
			name:    "a mount that never goes away: bounded",
			layers:  []string{"7:3 / %s rw - ext4 /dev/loop3 rw"},
			umounts: slices.Repeat([]umountResult{{}}, maxStackedMounts),
			wantErr: []string{"still mounted after 8 unmounts"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// A space in the name: umount must get the unescaped path.
			target := realDir(t, "pod vol")
			lines := []string{rootMount, "50 22 0:30 / /unrelated rw - tmpfs tmpfs rw"}
			for i, l := range tc.layers {
				lines = append(lines, fmt.Sprintf("%d 22 ", 100+i)+fmt.Sprintf(l, escape(target)))
			}
			table := newMountTable(t, lines...)

			var steps []*commandtest.Step
			for _, u := range tc.umounts {
				st := commandtest.Expect("umount", target)
				if u.stderr != "" {
					st.Exits(32, fmt.Sprintf(u.stderr, target))
				}
				steps = append(steps, st)
			}
			n := 0
			d, script := hookedDataPath(t, table.path, func(name string, args []string) {
				if name == "umount" && n < len(tc.umounts) {
					if tc.umounts[n].popped {
						table.popTop()
					}
					n++
				}
			}, steps...)

			err := d.Unmount(context.Background(), target)
			if tc.wantKind == nil && len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Unmount: %v", err)
				}
				if m, _ := d.MountAt(target); m != nil {
					t.Errorf("still mounted after Unmount: %+v", m)
				}
			} else {
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
			}
			if got := len(script.Ran()); got != len(tc.umounts) {
				t.Errorf("%d umounts ran, want %d", got, len(tc.umounts))
			}
		})
	}
}

func TestBindMount(t *testing.T) {
	const src, dst = "/staging/globalmount", "/pods/uid/volumes/kubernetes.io~csi/pv/mount"
	tests := []struct {
		name     string
		readOnly bool
		steps    []*commandtest.Step
		wantErr  []string
	}{
		{
			name:  "read-write: one bind",
			steps: []*commandtest.Step{commandtest.Expect("mount", "--bind", src, dst)},
		},
		{
			// The kernel ignores "ro" on the bind itself; it takes a remount.
			name:     "read-only: bind, then remount read-only",
			readOnly: true,
			steps: []*commandtest.Step{
				commandtest.Expect("mount", "--bind", src, dst),
				commandtest.Expect("mount", "-o", "remount,bind,ro", dst),
			},
		},
		{
			name:     "bind fails: no remount",
			readOnly: true,
			steps:    []*commandtest.Step{commandtest.Expect("mount", "--bind", src, dst).Exits(32, "mount: "+dst+": special device "+src+" does not exist.")},
			wantErr:  []string{"bind " + src + " on " + dst, "does not exist"},
		},
		{
			name:     "remount fails: error names the target",
			readOnly: true,
			steps: []*commandtest.Step{
				commandtest.Expect("mount", "--bind", src, dst),
				commandtest.Expect("mount", "-o", "remount,bind,ro", dst).Exits(32, "mount: "+dst+": permission denied."),
			},
			wantErr: []string{"make " + dst + " read-only", "permission denied"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := scriptedDataPath(t, tc.steps...)
			err := d.BindMount(context.Background(), src, dst, tc.readOnly)
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
	d, _ := scriptedDataPath(t,
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

func TestCheckHealthy(t *testing.T) {
	dir := t.TempDir()
	if corrupted, err := CheckHealthy(dir); corrupted || err != nil {
		t.Errorf("CheckHealthy(existing dir) = %v, %v; want false, nil", corrupted, err)
	}
	corrupted, err := CheckHealthy(filepath.Join(dir, "missing"))
	if corrupted || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CheckHealthy(missing) = %v, %v; want false and a not-exist error", corrupted, err)
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
		if err := RemoveMountPoint(p); err != nil {
			t.Errorf("RemoveMountPoint(%q): %v", p, err)
		}
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%q still exists", p)
		}
	}
	// A directory with content is never removed recursively: it may be a
	// volume whose unmount did not happen.
	if err := RemoveMountPoint(full); err == nil {
		t.Error("RemoveMountPoint of a non-empty directory succeeded")
	}
	if _, err := os.Stat(filepath.Join(full, "data")); err != nil {
		t.Errorf("content of a non-empty mount point was touched: %v", err)
	}
}
