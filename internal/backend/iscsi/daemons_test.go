package iscsi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// attachDaemon is the attach daemon as the node plugin's runner sees it.
type attachDaemon struct {
	err     error
	checked []string
}

func (a *attachDaemon) Check(_ context.Context, programs ...string) error {
	a.checked = append(a.checked, programs...)
	return a.err
}
func (a *attachDaemon) Dir() string { return "/run/spindle/attachd" }

// qemu-storage-daemon starts in the attach daemon, from a state directory
// the node plugin made (the FUSE export's mount point, the CHAP secret it
// reads before it daemonizes); nothing runs in the node plugin.
func TestUserspaceDaemonRunsInTheAttachDaemon(t *testing.T) {
	state := t.TempDir()
	s := session{Portals: []string{"192.168.77.1:3260"}, IQN: "iqn.2026-01.dev.spindle:tgt.vol-1", LUN: 1,
		Initiator: "iqn.2026-01.dev.spindle.node:worker-1", CHAP: &CHAP{User: "u", Password: "chap-secret-1"}}
	u := &userspace{stateDir: state, loops: blockdev.NewFakeLoopDevices(), devRoot: "/dev"}
	dir := u.dir(s.IQN)
	remote := commandtest.New(t, commandtest.Expect("qemu-storage-daemon",
		"--object", "secret,id=chap,format=raw,file="+filepath.Join(dir, "chap"),
		"--blockdev", fmt.Sprintf("driver=iscsi,node-name=lun,transport=tcp,portal=%s,target=%s,lun=1,initiator-name=%s,user=u,password-secret=chap", s.Portals[0], s.IQN, s.Initiator),
		"--export", "type=fuse,id=lun,node-name=lun,mountpoint="+filepath.Join(dir, "lun")+",writable=on",
		"--chardev", "socket,id=qmp,server=on,wait=off,path="+filepath.Join(dir, "qmp.sock"),
		"--monitor", "chardev=qmp",
		"--pidfile", filepath.Join(dir, "qsd.pid"),
		"--daemonize",
	).Does(func() {
		if got, err := os.ReadFile(filepath.Join(dir, "chap")); err != nil || string(got) != s.CHAP.Password {
			t.Errorf("the CHAP secret file while the daemon starts: %q, %v", got, err)
		}
		if st, err := os.Stat(filepath.Join(dir, "lun")); err != nil || !st.Mode().IsRegular() {
			t.Errorf("the export's mount point: %v, %v", st, err)
		}
	}))
	u.run = command.New(commandtest.New(t), nil).WithDaemons(command.New(remote, nil), &attachDaemon{})
	if err := u.start(context.Background(), s); err != nil {
		t.Fatalf("start: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "chap")); !os.IsNotExist(err) {
		t.Errorf("the CHAP secret file outlived the start: %v", err)
	}
}

// An attach daemon that does not answer makes the userspace attacher
// unusable, and the probe says so.
func TestUserspaceProbeAsksTheAttachDaemon(t *testing.T) {
	daemon := &attachDaemon{err: errors.New("the attach daemon at /run/spindle/attachd/attachd.sock does not answer")}
	u := &userspace{stateDir: t.TempDir(), loops: blockdev.NewFakeLoopDevices(), devRoot: "/dev",
		run: command.New(commandtest.New(t), nil).WithDaemons(command.New(commandtest.New(t), nil), daemon)}
	testutil.WantKind(t, u.Probe(context.Background()), errdefs.ErrUnavailable, "qemu-storage-daemon", "does not answer")
	if len(daemon.checked) != 1 || daemon.checked[0] != "qemu-storage-daemon" {
		t.Errorf("the probe asked the attach daemon about %v", daemon.checked)
	}
}
