// Package iscsitest runs a real iSCSI target for tests — a tgtd of their
// own (through hack/tgtd.sh, on 127.0.0.1 only, its control socket in a
// test directory) or the kernel's LIO — and builds iSCSI backend
// configurations that use it with the userspace or the kernel initiator, as
// the environment selects (ModeFromEnv; `make vmtest` runs the kernel ones
// in a guest with Debian's kernel).
package iscsitest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/backend/iscsi"
)

// Prefixes of the IQNs tests use.
const (
	TargetPrefix    = "iqn.2026-01.dev.spindle"
	InitiatorPrefix = "iqn.2026-01.dev.spindle.node"
)

// Target is an iSCSI target started for one test: a tgtd of its own, or
// the kernel's LIO target (one per machine, so one test at a time).
type Target struct {
	Mode   Mode
	Dir    string // tgt: holds the control socket, pid file and log
	Socket string // tgt: TGT_IPC_SOCKET
	Portal string // 127.0.0.1:<port>
}

// StartTarget starts the target of the mode the environment selects (see
// ModeFromEnv) and stops it, with every target it holds, when the test
// ends. tgtd listens on a free port of 127.0.0.1; LIO on its default
// portal, 0.0.0.0:3260.
func StartTarget(t testing.TB) *Target {
	t.Helper()
	mode := Require(t)
	if mode.Target == iscsi.ToolLIO {
		return startLIO(t, mode)
	}
	script := filepath.Join(moduleRoot(t), "hack", "tgtd.sh")
	dir, err := os.MkdirTemp("", "spindle-tgtd-")
	if err != nil {
		t.Fatal(err)
	}
	var port int
	var out []byte
	for range 5 {
		port = freePort(t)
		out, err = run(script, "start", dir, fmt.Sprint(port))
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("start tgtd: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := run(script, "stop", dir); err != nil {
			t.Errorf("stop tgtd: %v\n%s", err, out)
		}
		_ = os.RemoveAll(dir)
	})
	return &Target{Mode: mode, Dir: dir, Socket: filepath.Join(dir, "tgtd.socket"), Portal: fmt.Sprintf("127.0.0.1:%d", port)}
}

// startLIO clears LIO's configuration before and after the test, so that
// what one test leaves cannot pass or fail the next.
func startLIO(t testing.TB, mode Mode) *Target {
	t.Helper()
	clear := func() error {
		out, err := run("targetcli", "clearconfig", "confirm=True")
		if err != nil {
			return fmt.Errorf("targetcli clearconfig: %v: %s", err, out)
		}
		return nil
	}
	if err := clear(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := clear(); err != nil {
			t.Error(err)
		}
	})
	return &Target{Mode: mode, Portal: "127.0.0.1:3260"}
}

// Targets lists the IQNs the target serves, read with tgtadm or from
// LIO's configfs directly, not through the code under test.
func (d *Target) Targets(t testing.TB) []string {
	t.Helper()
	iqns, err := d.TargetIQNs()
	if err != nil {
		t.Fatal(err)
	}
	return iqns
}

// TargetIQNs is Targets for callers without a testing.TB.
func (d *Target) TargetIQNs() ([]string, error) {
	if d.Mode.Target == iscsi.ToolLIO {
		return lioTargetIQNs()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "tgtadm", "--lld", "iscsi", "--mode", "target", "--op", "show")
	cmd.Env = append(os.Environ(), "TGT_IPC_SOCKET="+d.Socket, "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("tgtadm show: %v: %s", err, out)
	}
	var iqns []string
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "Target "); ok {
			if _, iqn, ok := strings.Cut(rest, ": "); ok {
				iqns = append(iqns, iqn)
			}
		}
	}
	return iqns, nil
}

// Restart stops tgtd and starts it again on the same port and socket: a
// tgtd restart loses every target, as in production. LIO keeps its
// configuration in the kernel, so the tests of a restart skip with it.
func (d *Target) Restart(t testing.TB) {
	t.Helper()
	if d.Mode.Target != iscsi.ToolTgt {
		t.Skipf("only tgtd forgets its targets when restarted; this run's target is %s", d.Mode.Target)
	}
	script := filepath.Join(moduleRoot(t), "hack", "tgtd.sh")
	if out, err := run(script, "stop", d.Dir); err != nil {
		t.Fatalf("stop tgtd: %v\n%s", err, out)
	}
	_, port, _ := net.SplitHostPort(d.Portal)
	if out, err := run(script, "start", d.Dir, port); err != nil {
		t.Fatalf("restart tgtd: %v\n%s", err, out)
	}
}

// Config is an iSCSI instance on d with the run's attach mode, its pool
// in poolDir and its node state in a fresh short directory (unix socket
// paths are limited to 108 bytes).
func (d *Target) Config(t testing.TB, poolDir string) iscsi.Config {
	t.Helper()
	state, err := os.MkdirTemp("", "spindle-iscsi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(state) })
	return iscsi.Config{
		PoolDir:          poolDir,
		Portals:          []string{d.Portal},
		TargetTool:       d.Mode.Target,
		TgtControlSocket: d.Socket,
		TargetPrefix:     TargetPrefix,
		InitiatorPrefix:  InitiatorPrefix,
		AttachMode:       d.Mode.Attach,
		StateDir:         state,
	}
}

// YAML is the driver's --config content for one iscsi instance named name.
func YAML(name string, c iscsi.Config) string {
	return fmt.Sprintf(`backends:
  - type: iscsi
    name: %s
    iscsi:
      poolDir: %q
      portals: [%q]
      targetTool: %s
      tgtControlSocket: %q
      targetPrefix: %s
      initiatorPrefix: %s
      attachMode: %s
      stateDir: %q
`, name, c.PoolDir, c.Portals[0], c.TargetTool, c.TgtControlSocket, c.TargetPrefix, c.InitiatorPrefix, c.AttachMode, c.StateDir)
}

func run(script string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, script, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd.CombinedOutput()
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// moduleRoot is the directory of go.mod, above the test's directory.
func moduleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test directory")
		}
		dir = parent
	}
}

// CheckNoLeaks registers a cleanup that fails t for a loop device, FUSE
// mount or qemu-storage-daemon of stateDir (a userspace attacher's), or a
// kernel session to one of the tests' targets, still there when the test
// ends, and then removes them, so one failing test does not poison the
// next.
func CheckNoLeaks(t testing.TB, stateDir string) {
	t.Cleanup(func() {
		for _, iqn := range kernelSessions() {
			t.Errorf("kernel iSCSI session to %s left logged in", iqn)
			_, _ = run("iscsiadm", "-m", "node", "-T", iqn, "--logout")
		}
		paths, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		for _, p := range paths {
			data, _ := os.ReadFile(p)
			if file := strings.TrimSpace(string(data)); strings.HasPrefix(file, stateDir+"/") {
				dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(p)))
				t.Errorf("loop device %s left bound to %s", dev, file)
				_ = exec.Command("losetup", "-d", dev).Run()
			}
		}
		pids, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range pids {
			data, _ := os.ReadFile(p)
			if strings.HasPrefix(string(data), "qemu-storage-daemon\x00") && strings.Contains(string(data), stateDir+"/") {
				pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
				if err != nil {
					continue
				}
				t.Errorf("qemu-storage-daemon %d left running", pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		for _, line := range strings.Split(string(mounts), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], stateDir+"/") {
				t.Errorf("FUSE export left mounted at %s", f[4])
				_ = syscall.Unmount(f[4], syscall.MNT_DETACH)
			}
		}
	})
}

// kernelSessions lists the targets with TargetPrefix that the kernel
// initiator is logged in to (none where iscsiadm is missing).
func kernelSessions() []string {
	if _, err := exec.LookPath("iscsiadm"); err != nil {
		return nil
	}
	// "tcp: [1] 127.0.0.1:3260,1 iqn.2026-01.dev.spindle:... (non-flash)";
	// with no session iscsiadm exits 21 and prints nothing on stdout.
	out, _ := exec.Command("iscsiadm", "-m", "session").Output()
	var iqns []string
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, TargetPrefix+":") {
				iqns = append(iqns, f)
			}
		}
	}
	return iqns
}
