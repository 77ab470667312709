//go:build cgo && ceph

package rbdtest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/spindle-csi/spindle/internal/backend/rbd"
	"github.com/spindle-csi/spindle/internal/ceph/cephtest"
)

// The environment that selects how the tests map images and which Ceph
// they use. Unset, they map with rbd-fuse (a FUSE file served by
// qemu-storage-daemon, which needs no kernel module) on a cluster of their
// own; `make vmtest` runs krbd and rbd-nbd in a guest whose kernel has
// them, against a Ceph on the host (cephtest.EnvCephDir, EnvCephMon).
const (
	EnvMounter = "SPINDLE_RBD_MOUNTER" // rbd-fuse (default) | krbd | rbd-nbd
	EnvCephDir = cephtest.EnvCephDir
	EnvCephMon = cephtest.EnvCephMon
)

func mounterFromEnv() (string, error) {
	switch m := os.Getenv(EnvMounter); m {
	case "":
		return rbd.MounterFuse, nil
	case rbd.MounterFuse, rbd.MounterKRBD, rbd.MounterNBD:
		return m, nil
	default:
		return "", fmt.Errorf("%s=%q: want %s, %s or %s", EnvMounter, m, rbd.MounterFuse, rbd.MounterKRBD, rbd.MounterNBD)
	}
}

// requireMounter says what this machine lacks to map with mounter.
func requireMounter(mounter string) error {
	need := map[string][]string{
		rbd.MounterFuse: {"qemu-storage-daemon", "losetup"},
		rbd.MounterKRBD: {"rbd"},
		rbd.MounterNBD:  {"rbd", "rbd-nbd"},
	}[mounter]
	for _, p := range need {
		if _, err := exec.LookPath(p); err != nil {
			return fmt.Errorf("%s needs %s, which is not in the Ceph root (rebuild it: hack/ceph/root.sh)", mounter, p)
		}
	}
	module := map[string]string{rbd.MounterKRBD: "rbd", rbd.MounterNBD: "nbd"}[mounter]
	if module == "" {
		if _, err := os.Stat("/dev/fuse"); err != nil {
			return fmt.Errorf("no /dev/fuse: the rbd-fuse mounter cannot serve an image here")
		}
		return nil
	}
	if _, err := os.Stat("/sys/module/" + module); err == nil {
		return nil
	}
	// Loadable, not loaded: the driver's probe and the first map load it,
	// and the tests must see them do so.
	if out, err := exec.Command("modprobe", "--dry-run", module).CombinedOutput(); err != nil {
		return fmt.Errorf("%s needs the %s kernel module, which this kernel does not have: modprobe: %v: %s", mounter, module, err, strings.TrimSpace(string(out)))
	}
	return nil
}
