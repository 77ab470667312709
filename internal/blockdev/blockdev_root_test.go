//go:build root

package blockdev

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/testutil"
)

// A mounted filesystem holds its device: InUse sees it, and no longer
// once it is unmounted.
func TestInUseSeesAMount(t *testing.T) {
	testutil.RequireRoot(t, "mount a filesystem on a loop device")
	dir := testutil.ScratchFilesystem(t, "ext4", 32<<20, "-q")
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	uevent, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/uevent", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		t.Fatal(err)
	}
	var dev string
	for _, line := range strings.Split(string(uevent), "\n") {
		if name, ok := strings.CutPrefix(line, "DEVNAME="); ok {
			dev = "/dev/" + name
		}
	}
	busy, err := InUse(dev)
	if err != nil || !busy {
		t.Fatalf("device %q of the mount at %s: busy=%t, %v; want in use", dev, dir, busy, err)
	}
}
