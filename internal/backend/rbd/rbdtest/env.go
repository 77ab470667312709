package rbdtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/spindle-csi/spindle/internal/backend/rbd"
)

// The environment that selects how the tests map images and which Ceph
// they use. Unset, they map with rbd-fuse (which needs no kernel module)
// on a cluster of their own; `make vmtest` runs krbd and rbd-nbd in a guest
// whose kernel has them, against a Ceph on the host.
const (
	EnvMounter = "SPINDLE_RBD_MOUNTER" // rbd-fuse (default) | krbd | rbd-nbd
	// EnvCephDir names a running cluster to use instead of starting one:
	// the directory holds its ceph.conf and ceph.client.admin.keyring, and
	// it has the pool Pool.
	EnvCephDir = "SPINDLE_CEPH_DIR"
	// EnvCephMon is that cluster's monitor, host:port (msgr2).
	EnvCephMon = "SPINDLE_CEPH_MON"
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
		rbd.MounterFuse: {"rbd", "rbd-fuse", "losetup"},
		rbd.MounterKRBD: {"rbd"},
		rbd.MounterNBD:  {"rbd", "rbd-nbd"},
	}[mounter]
	for _, p := range need {
		if _, err := exec.LookPath(p); err != nil {
			return fmt.Errorf("%s needs %s, which is not installed (Debian packages ceph-common rbd-fuse rbd-nbd)", mounter, p)
		}
	}
	module := map[string]string{rbd.MounterKRBD: "rbd", rbd.MounterNBD: "nbd"}[mounter]
	if module == "" {
		if _, err := os.Stat("/dev/fuse"); err != nil {
			return fmt.Errorf("no /dev/fuse: rbd-fuse cannot mount here")
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

// external is the running cluster in dir (EnvCephDir).
func external(dir, mounter string) (*Cluster, error) {
	mon := os.Getenv(EnvCephMon)
	if mon == "" {
		return nil, fmt.Errorf("%s is set but %s (the monitor's host:port) is not", EnvCephDir, EnvCephMon)
	}
	keyring, err := os.ReadFile(filepath.Join(dir, "ceph.client.admin.keyring"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvCephDir, err)
	}
	// [client.admin]\n\tkey = AQ...==
	var key string
	for _, line := range strings.Split(string(keyring), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && strings.TrimSpace(k) == "key" {
			key = strings.TrimSpace(v)
		}
	}
	if key == "" {
		return nil, fmt.Errorf("%s: no key in ceph.client.admin.keyring", dir)
	}
	keyDir, err := os.MkdirTemp("", "spindle-ceph-key-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, Conf: filepath.Join(dir, "ceph.conf"), Monitor: mon, Pool: Pool, User: "admin",
		Key: key, KeyFile: filepath.Join(keyDir, "admin.key"), Mounter: mounter, external: true}
	if err := os.WriteFile(c.KeyFile, []byte(key), 0o600); err != nil {
		return nil, err
	}
	return c, nil
}
