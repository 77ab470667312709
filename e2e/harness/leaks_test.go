//go:build root

package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/testutil"
)

// recordingTB is the part of testing.TB CheckNoLeaks uses, recorded.
type recordingTB struct {
	testing.TB
	cleanups []func()
	errors   []string
}

func (r *recordingTB) Helper()          {}
func (r *recordingTB) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recordingTB) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recordingTB) end() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// bindLoop binds a loop device to a new 16 MiB file in pool; t's cleanup
// detaches it if it is still bound there.
func bindLoop(t *testing.T, pool, name string) string {
	t.Helper()
	file := filepath.Join(pool, name)
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, 16<<20); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup --find --show %s: %v: %s", file, err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if b, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/loop/backing_file"); err == nil && strings.TrimSpace(string(b)) == file {
			_ = exec.Command("losetup", "-d", dev).Run()
		}
	})
	return dev
}

// A loop device an enclosing test holds (bound before CheckNoLeaks) is not
// the inner test's leak; one bound during the inner test and left is,
// and the check detaches it.
func TestCheckNoLeaksReportsOnlyTheTestsOwnDevices(t *testing.T) {
	testutil.RequireRoot(t, "bind loop devices")
	testutil.RequireCommands(t, "losetup")
	pool := t.TempDir()
	held := bindLoop(t, pool, "held.img")

	inner := &recordingTB{}
	CheckNoLeaks(inner, pool, t.TempDir())
	leaked := bindLoop(t, pool, "leaked.img")
	inner.end()

	if len(inner.errors) != 1 || !strings.Contains(inner.errors[0], "loop device left behind: "+leaked+" ") {
		t.Errorf("the inner test's errors: %q; want one, naming %s (and not %s)", inner.errors, leaked, held)
	}
	if bound := LoopDevicesUnder(pool); len(bound) != 1 || bound[0] != held {
		t.Errorf("after the check the pool's loop devices are %v, want only the held %s (the leaked one detached)", bound, held)
	}
}
