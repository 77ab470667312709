// Package testutil holds the few helpers Spindle's tests share across
// packages: the test tiers' requirements (a root-tier test fails, naming
// what is missing, rather than skipping: `make test` promises the tier),
// scratch filesystems, and checking the kind and message of an error.
package testutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/errdefs"
	"golang.org/x/sys/unix"
)

// RequireRoot declares t a root-tier test that needs root to do why. Its
// file must carry the build constraint "root" (docs/testing.md, "Test
// tiers"): compiled into the unit tier, it fails saying so, so that a test
// needing root cannot slip into what `go test ./...` runs everywhere; in
// the root tier, run without root, it fails naming why.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if !rootTier {
		t.Fatalf("this test needs root to %s, so it belongs to the root tier: build it with -tags root (its file needs the build constraint //go:build root)", why)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("the root tier (-tags root) needs root to %s: run it as root, as `make test` does", why)
	}
}

// RequireCommands declares t a root-tier test that runs these programs of
// the machine; it fails, naming what is missing, unless every one is on
// PATH (hack/install-deps.sh installs them all). Like RequireRoot, it fails
// in the unit tier, which runs no program of the machine.
func RequireCommands(t testing.TB, names ...string) {
	t.Helper()
	if !rootTier {
		t.Fatalf("this test runs %s, so it belongs to the root tier: build it with -tags root (its file needs the build constraint //go:build root)", strings.Join(names, ", "))
	}
	var missing []string
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("missing %s: run hack/install-deps.sh", strings.Join(missing, ", "))
	}
}

// WantKind fails t unless err is of kind (an errdefs sentinel), as the
// outermost kind, and its message mentions every string in mentions.
func WantKind(t testing.TB, err, kind error, mentions ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got success, want a %q error", kind)
	}
	if errdefs.KindOf(err) != kind || !errors.Is(err, kind) {
		t.Fatalf("error = %v (kind %v), want kind %q", err, errdefs.KindOf(err), kind)
	}
	for _, m := range mentions {
		if !strings.Contains(err.Error(), m) {
			t.Fatalf("error %q does not name %q", err, m)
		}
	}
}

// ScratchFilesystem mounts a fresh filesystem of fsType (xfs, btrfs or ext4
// on a loop device over a sparse file, or tmpfs) of sizeBytes and returns
// its mount point; the mount and the loop device go away when the test
// ends. Tests use it for pools with properties /tmp lacks: reflink (xfs,
// btrfs), none (ext4, tmpfs), a size small enough to fill. mkfsArgs come
// before the device on mkfs's command line. Mounting needs root: in the
// unit tier the test skips, naming the root tier, where it runs.
func ScratchFilesystem(t testing.TB, fsType string, sizeBytes int64, mkfsArgs ...string) string {
	t.Helper()
	RootOnlyCase(t, "mount a scratch "+fsType+" filesystem")
	dir := filepath.Join(t.TempDir(), "mnt-"+fsType)
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	source, data := "spindle-test", ""
	if fsType == "tmpfs" {
		data = fmt.Sprintf("size=%d,mode=0750", sizeBytes)
	} else {
		RequireCommands(t, "losetup", "mkfs."+fsType)
		file := filepath.Join(t.TempDir(), fsType+".fs")
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(file, sizeBytes); err != nil {
			t.Fatal(err)
		}
		run(t, "mkfs."+fsType, append(mkfsArgs, file)...)
		source = strings.TrimSpace(run(t, "losetup", "--find", "--show", file))
		t.Cleanup(func() {
			if out, err := exec.Command("losetup", "--detach", source).CombinedOutput(); err != nil {
				t.Errorf("losetup --detach %s: %v: %s", source, err, out)
			}
		})
	}
	if err := unix.Mount(source, dir, fsType, unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		t.Fatalf("mount %s %s on %s: %v", fsType, source, dir, err)
	}
	// Registered after t.TempDir's removal and the detach, so it runs first.
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
	return dir
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).Output()
	if err != nil {
		stderr := ""
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

// RootOnlyCase is for a case of a unit-tier test that needs root to do why
// (a device node made with mknod, a scratch filesystem, the real-losetup
// half of a fake/real pair): the unit tier skips it, naming the tier it
// runs in; the root tier runs it, as RequireRoot would.
func RootOnlyCase(t testing.TB, why string) {
	t.Helper()
	if !rootTier {
		t.Skipf("needs root to %s: this case runs in the root tier (go test -tags root)", why)
	}
	RequireRoot(t, why)
}
