// Package iscsitest runs a real tgtd for tests (through hack/tgtd.sh, on
// 127.0.0.1 only, its control socket in a test directory) and builds iSCSI
// backend configurations that use it with the userspace attacher.
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
	"github.com/spindle-csi/spindle/internal/testutil"
)

// Programs the real iSCSI path needs here: the target, the userspace
// initiator, and libiscsi's tools that the ACL tests use.
var Programs = []string{"tgtd", "tgtadm", "qemu-storage-daemon", "iscsi-ls", "iscsi-inq", "losetup"}

// Prefixes of the IQNs tests use.
const (
	TargetPrefix    = "iqn.2026-01.dev.spindle"
	InitiatorPrefix = "iqn.2026-01.dev.spindle.node"
)

// Tgtd is a tgtd started for one test.
type Tgtd struct {
	Dir    string // holds the control socket, pid file and log
	Socket string // TGT_IPC_SOCKET
	Portal string // 127.0.0.1:<port>
}

// Require skips t, naming what is missing, unless the real iSCSI path can
// run here: root, the programs, FUSE and loop devices.
func Require(t testing.TB) {
	t.Helper()
	testutil.RequireRoot(t, "run tgtd, FUSE exports and loop devices")
	testutil.RequireCommands(t, Programs...)
	for _, dev := range []string{"/dev/fuse", "/dev/loop-control"} {
		if _, err := os.Stat(dev); err != nil {
			t.Skipf("missing %s: the userspace iSCSI attacher needs FUSE and loop devices", dev)
		}
	}
}

// StartTgtd starts a tgtd on a free port of 127.0.0.1 and stops it when
// the test ends.
func StartTgtd(t testing.TB) *Tgtd {
	t.Helper()
	Require(t)
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
	return &Tgtd{Dir: dir, Socket: filepath.Join(dir, "tgtd.socket"), Portal: fmt.Sprintf("127.0.0.1:%d", port)}
}

// Targets lists the IQNs tgtd serves, read with tgtadm directly.
func (d *Tgtd) Targets(t testing.TB) []string {
	t.Helper()
	iqns, err := d.TargetIQNs()
	if err != nil {
		t.Fatal(err)
	}
	return iqns
}

// TargetIQNs is Targets for callers without a testing.TB.
func (d *Tgtd) TargetIQNs() ([]string, error) {
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
// tgtd restart loses every target, as in production.
func (d *Tgtd) Restart(t testing.TB) {
	t.Helper()
	script := filepath.Join(moduleRoot(t), "hack", "tgtd.sh")
	if out, err := run(script, "stop", d.Dir); err != nil {
		t.Fatalf("stop tgtd: %v\n%s", err, out)
	}
	_, port, _ := net.SplitHostPort(d.Portal)
	if out, err := run(script, "start", d.Dir, port); err != nil {
		t.Fatalf("restart tgtd: %v\n%s", err, out)
	}
}

// Config is an iSCSI instance on d with the userspace attacher, its pool
// in poolDir and its node state in a fresh short directory (unix socket
// paths are limited to 108 bytes).
func (d *Tgtd) Config(t testing.TB, poolDir string) iscsi.Config {
	t.Helper()
	state, err := os.MkdirTemp("", "spindle-iscsi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(state) })
	return iscsi.Config{
		PoolDir:          poolDir,
		Portals:          []string{d.Portal},
		TargetTool:       iscsi.ToolTgt,
		TgtControlSocket: d.Socket,
		TargetPrefix:     TargetPrefix,
		InitiatorPrefix:  InitiatorPrefix,
		AttachMode:       iscsi.ModeUserspace,
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
// mount or qemu-storage-daemon of stateDir (a userspace attacher's) still
// there when the test ends, and then removes them, so one failing test does
// not poison the next.
func CheckNoLeaks(t testing.TB, stateDir string) {
	t.Cleanup(func() {
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
