//go:build root

package blockdev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/testutil"
	utilexec "k8s.io/utils/exec"
)

// A scan that meets a device being detached by someone else (another
// volume's unstage, at scale) skips it: the kernel removes the device's
// loop/ attributes under the reader, which then gets ENOENT, ENXIO or
// ENODEV, and none of them may fail the scan. 100 pods deleted at once on
// the local cluster failed NodeUnstageVolume with "read loop63/loop/
// backing_file: no such device" until this held.
func TestLosetupScanWhileDevicesDetach(t *testing.T) {
	testutil.RequireRoot(t, "bind and detach real loop devices")
	testutil.RequireCommands(t, "losetup")
	l := newLosetup(command.New(utilexec.New(), nil))
	dir := t.TempDir()
	const devices, rounds = 8, 10
	for round := range rounds {
		var attached []string
		for i := range devices {
			file := filepath.Join(dir, fmt.Sprintf("r%d-%d.img", round, i))
			if err := os.WriteFile(file, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(file, 1<<20); err != nil {
				t.Fatal(err)
			}
			dev, err := l.Attach(t.Context(), file, false, false)
			if err != nil {
				t.Fatal(err)
			}
			attached = append(attached, dev)
			t.Cleanup(func() { _ = l.Detach(context.Background(), dev) })
		}
		detached := make(chan error, 1)
		go func() {
			var errs []error
			for _, dev := range attached {
				errs = append(errs, l.Detach(context.Background(), dev))
			}
			detached <- errors.Join(errs...)
		}()
		for scanning := true; scanning; {
			select {
			case err := <-detached:
				if err != nil {
					t.Fatal(err)
				}
				scanning = false
			default:
			}
			if _, err := l.BoundUnder(t.Context(), dir); err != nil {
				t.Fatalf("round %d: a scan while devices detach: %v", round, err)
			}
		}
		// Every device is detached now: the scan must say so.
		if got, err := l.BoundUnder(t.Context(), dir); err != nil || len(got) != 0 {
			t.Fatalf("round %d: after the detaches BoundUnder = %+v, %v; want none", round, got, err)
		}
	}
}
