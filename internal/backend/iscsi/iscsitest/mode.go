package iscsitest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend/iscsi"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// The environment that selects the mode the real-target tests run in.
// Unset, they run what every machine of this project can: tgtd and the
// userspace initiator. `make vmtest` sets them in a guest whose kernel has
// iscsi_tcp and LIO.
const (
	EnvTarget = "SPINDLE_ISCSI_TARGET" // tgt (default) | lio
	EnvAttach = "SPINDLE_ISCSI_ATTACH" // userspace (default) | kernel
)

// Mode is a target implementation and an attach mode.
type Mode struct {
	Target string // iscsi.ToolTgt or iscsi.ToolLIO
	Attach string // iscsi.ModeUserspace or iscsi.ModeKernel
}

// String is the mode as reports name it: "kernel/tgt", "userspace/tgt",
// "kernel/lio".
func (m Mode) String() string { return m.Attach + "/" + m.Target }

// ModeFromEnv reads EnvTarget and EnvAttach.
func ModeFromEnv() (Mode, error) {
	m := Mode{Target: os.Getenv(EnvTarget), Attach: os.Getenv(EnvAttach)}
	if m.Target == "" {
		m.Target = iscsi.ToolTgt
	}
	if m.Attach == "" {
		m.Attach = iscsi.ModeUserspace
	}
	if m.Target != iscsi.ToolTgt && m.Target != iscsi.ToolLIO {
		return m, fmt.Errorf("%s=%q: want %q or %q", EnvTarget, m.Target, iscsi.ToolTgt, iscsi.ToolLIO)
	}
	if m.Attach != iscsi.ModeUserspace && m.Attach != iscsi.ModeKernel {
		return m, fmt.Errorf("%s=%q: want %q or %q", EnvAttach, m.Attach, iscsi.ModeUserspace, iscsi.ModeKernel)
	}
	return m, nil
}

// Require fails t, naming what is missing, unless the real iSCSI path of
// the environment's mode (the root tier's: tgtd and the userspace attacher
// by default) can run here, and returns the mode. A malformed mode fails
// the test too: a typo must not turn a run into skips.
func Require(t testing.TB) Mode {
	t.Helper()
	mode, err := ModeFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	testutil.RequireRoot(t, "run an iSCSI target and attach its LUNs")
	switch mode.Target {
	case iscsi.ToolTgt:
		testutil.RequireCommands(t, "tgtd", "tgtadm")
	case iscsi.ToolLIO:
		testutil.RequireCommands(t, "targetcli")
		requireModules(t, "the LIO target", []string{"modprobe"}, "target_core_mod", "target_core_file", "iscsi_target_mod")
		// The iscsi fabric directory appears with the first target;
		// target_core_mod's own directory says configfs is there.
		if _, err := os.Stat("/sys/kernel/config/target"); err != nil {
			t.Fatalf("LIO's configfs is missing (/sys/kernel/config/target; is configfs mounted?): %v", err)
		}
	}
	switch mode.Attach {
	case iscsi.ModeUserspace:
		testutil.RequireCommands(t, "qemu-storage-daemon", "losetup")
		for _, dev := range []string{"/dev/fuse", "/dev/loop-control"} {
			if _, err := os.Stat(dev); err != nil {
				t.Fatalf("missing %s: the userspace iSCSI attacher needs FUSE and loop devices", dev)
			}
		}
	case iscsi.ModeKernel:
		testutil.RequireCommands(t, "iscsiadm")
		// Loadable, not loaded: the driver loads iscsi_tcp itself (its
		// probe, its first login), and the tests must see it do so.
		requireModules(t, "the kernel initiator", []string{"modprobe", "--dry-run"}, "iscsi_tcp")
	}
	return mode
}

// requireModules runs modprobe (the command line in modprobe, to load or
// only to resolve) for each module not loaded yet, or fails t naming the
// one this kernel lacks.
func requireModules(t testing.TB, what string, modprobe []string, modules ...string) {
	t.Helper()
	for _, m := range modules {
		if _, err := os.Stat("/sys/module/" + m); err == nil {
			continue
		}
		if out, err := exec.Command(modprobe[0], append(modprobe[1:], m)...).CombinedOutput(); err != nil {
			t.Fatalf("%s needs the %s module, which this kernel does not have: modprobe: %v: %s", what, m, err, strings.TrimSpace(string(out)))
		}
	}
}

// lioTargetIQNs lists LIO's iSCSI targets from configfs.
func lioTargetIQNs() ([]string, error) {
	entries, err := os.ReadDir("/sys/kernel/config/target/iscsi")
	if os.IsNotExist(err) {
		return nil, nil // the fabric directory comes with the first target
	}
	if err != nil {
		return nil, err
	}
	var iqns []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "iqn.") {
			iqns = append(iqns, e.Name())
		}
	}
	return iqns, nil
}
