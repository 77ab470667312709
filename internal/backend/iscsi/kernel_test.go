package iscsi

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

const (
	kIQN    = "iqn.2026-01.dev.spindle:test.pvc-k"
	kPortal = "127.0.0.1:3260"
	kInit   = "iqn.2026-01.dev.spindle.node:node-a"
	kSerial = "spindle00112233445566778899aabb"
	// What open-iscsi 2.1.8 (Debian 12) prints for an iface it has no
	// record of, with exit status 6 (seen in make vmtest's guest).
	kIfaceNew = "iSCSI ERROR: Failed to open /etc/iscsi/ifaces/spindle using read mode: 2 No such file or directory # idbm.c:_idbm_recs_read():834\n"
)

// fakeNode is a node's /sys and /dev as the kernel initiator leaves them
// after a login: the iscsi_tcp module, sdX with its serial, udev's link.
type fakeNode struct {
	sys, dev, state string
}

func newFakeNode(t *testing.T, module bool) *fakeNode {
	root := t.TempDir()
	n := &fakeNode{sys: filepath.Join(root, "sys"), dev: filepath.Join(root, "dev"), state: filepath.Join(root, "state")}
	for _, d := range []string{n.sys + "/block", n.dev + "/disk/by-path"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if module {
		if err := os.MkdirAll(n.sys+"/module/iscsi_tcp", 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// disk makes /dev/<name> with serial, linked from by-path for iqn's lun.
func (n *fakeNode) disk(t *testing.T, name, iqn string, lun int, serial string) {
	t.Helper()
	dir := filepath.Join(n.sys, "block", name)
	if err := os.MkdirAll(dir+"/device", 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		// tgt right-aligns the serial in a 36-byte field (seen in make
		// vmtest's guest: "     spindle4d0f...").
		dir + "/device/vpd_pg80": "\x00\x80\x00\x24" + fmt.Sprintf("%36s", serial),
		dir + "/device/delete":   "",
		dir + "/ro":              "0\n",
		dir + "/size":            "16384\n",
		n.dev + "/" + name:       "",
	}
	for p, c := range files {
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(n.dev, "disk", "by-path", "ip-"+kPortal+"-iscsi-"+iqn+"-lun-"+string(rune('0'+lun)))
	if err := os.Symlink("../../"+name, link); err != nil {
		t.Fatal(err)
	}
}

func (n *fakeNode) kernel(t *testing.T, steps ...*commandtest.Step) *kernel {
	k := newKernel(command.New(commandtest.New(t, steps...), nil), n.state)
	k.sysRoot, k.devRoot, k.deviceWait = n.sys, n.dev, 100*time.Millisecond
	return k
}

func iscsiadm(args ...string) *commandtest.Step { return commandtest.Expect("iscsiadm", args...) }

func nodeArgs(args ...string) []string {
	return append([]string{"-m", "node", "-T", kIQN, "-p", kPortal, "-I", "spindle"}, args...)
}

func kSession(chap *CHAP) session {
	return session{ImageID: "pvc-k", Portals: []string{kPortal}, IQN: kIQN, LUN: 1, Serial: kSerial, Initiator: kInit, CHAP: chap}
}

// The exact open-iscsi sequence of a first login with mutual CHAP: the
// node's own iface gets the derived initiator name, discovery finds the
// target, the node record gets the credentials (never shown in errors or
// logs), the login, and the disk is proven by its serial.
func TestKernelConnectSequence(t *testing.T) {
	n := newFakeNode(t, true)
	n.disk(t, "sdb", kIQN, 1, kSerial)
	chap := &CHAP{User: "alice", Password: "pw-a", MutualUser: "tgt", MutualPassword: "pw-t"}
	k := n.kernel(t,
		iscsiadm("-m", "iface", "-I", "spindle", "-o", "show").Exits(6, kIfaceNew),
		iscsiadm("-m", "iface", "-I", "spindle", "-o", "new").Prints("New interface spindle added\n"),
		iscsiadm("-m", "iface", "-I", "spindle", "-o", "update", "-n", "iface.initiatorname", "-v", kInit).Prints("spindle updated.\n"),
		iscsiadm("-m", "discovery", "-t", "sendtargets", "-p", kPortal, "-I", "spindle").Prints(kPortal+",1 iqn.2026-01.dev.spindle:test.other\n"+kPortal+",1 "+kIQN+"\n"),
		iscsiadm(nodeArgs("-o", "update", "-n", "node.session.auth.authmethod", "-v", "CHAP")...),
		iscsiadm(nodeArgs("-o", "update", "-n", "node.session.auth.username", "-v", "alice")...),
		iscsiadm(nodeArgs("-o", "update", "-n", "node.session.auth.password", "-v", "pw-a")...),
		iscsiadm(nodeArgs("-o", "update", "-n", "node.session.auth.username_in", "-v", "tgt")...),
		iscsiadm(nodeArgs("-o", "update", "-n", "node.session.auth.password_in", "-v", "pw-t")...),
		iscsiadm(nodeArgs("--login")...).Prints("Logging in to [iface: spindle, target: "+kIQN+", portal: 127.0.0.1,3260]\nLogin to [iface: spindle, target: "+kIQN+", portal: 127.0.0.1,3260] successful.\n"),
	)
	d, err := k.Connect(t.Context(), kSession(chap))
	if err != nil {
		t.Fatal(err)
	}
	if d.Path != n.dev+"/sdb" || d.ReadOnly {
		t.Fatalf("Connect = %+v, want read-write %s/sdb", d, n.dev)
	}
	refs, err := k.readRefs()
	if err != nil || refs[kIQN] == nil || refs[kIQN].Portal != kPortal || len(refs[kIQN].LUNs) != 1 {
		t.Fatalf("session counts = %+v, %v", refs, err)
	}
	devs, err := k.Devices(t.Context(), kIQN, kSerial)
	if err != nil || len(devs) != 1 || devs[0].Path != d.Path {
		t.Fatalf("Devices = %+v, %v", devs, err)
	}
}

// loginToExistingSession is the exact sequence of a login without CHAP to
// a target this node already has a session with: the iface as it is,
// discovery, the node record, and "session exists" (15).
func loginToExistingSession() []*commandtest.Step {
	return []*commandtest.Step{
		iscsiadm("-m", "iface", "-I", "spindle", "-o", "show").Prints("# BEGIN RECORD 2.1.8\niface.iscsi_ifacename = spindle\niface.initiatorname = " + kInit + "\n# END RECORD\n"),
		iscsiadm("-m", "discovery", "-t", "sendtargets", "-p", kPortal, "-I", "spindle").Prints(kPortal + ",1 " + kIQN + "\n"),
		iscsiadm(nodeArgs("-o", "update", "-n", "node.session.auth.authmethod", "-v", "None")...),
		iscsiadm(nodeArgs("--login")...).Exits(15, "iscsiadm: default: 1 session requested, but 1 already present.\niscsiadm: Could not log into all portals"),
	}
}

// A second volume's login reuses the iface as it is, and an existing
// session ("session exists", 15) is no failure.
func TestKernelConnectReusesIfaceAndSession(t *testing.T) {
	n := newFakeNode(t, true)
	n.disk(t, "sdc", kIQN, 1, kSerial)
	k := n.kernel(t, loginToExistingSession()...)
	if _, err := k.Connect(t.Context(), kSession(nil)); err != nil {
		t.Fatal(err)
	}
}

// The failures an operator must be able to act on, with iscsiadm's real
// texts: each gets a kind and a message naming what is wrong.
func TestKernelConnectFailures(t *testing.T) {
	show := iscsiadm("-m", "iface", "-I", "spindle", "-o", "show").Prints("iface.initiatorname = " + kInit + "\n")
	discover := func() *commandtest.Step {
		return iscsiadm("-m", "discovery", "-t", "sendtargets", "-p", kPortal, "-I", "spindle").Prints(kPortal + ",1 " + kIQN + "\n")
	}
	authNone := func() *commandtest.Step {
		return iscsiadm(nodeArgs("-o", "update", "-n", "node.session.auth.authmethod", "-v", "None")...)
	}
	loginFails := func(code int, text string) *commandtest.Step {
		return iscsiadm(nodeArgs("--login")...).Exits(code, "iscsiadm: Could not login to [iface: spindle, target: "+kIQN+", portal: 127.0.0.1,3260].\n"+text+"\niscsiadm: Could not log into all portals")
	}
	tests := []struct {
		name     string
		steps    []*commandtest.Step
		kind     error
		mentions []string
	}{
		{
			name:     "auth failure",
			steps:    []*commandtest.Step{show, discover(), authNone(), loginFails(24, "iscsiadm: initiator reported error (24 - iSCSI login failed due to authorization failure)")},
			kind:     errdefs.ErrPrecondition,
			mentions: []string{"CHAP authentication", kInit, kIQN},
		},
		{
			name:     "no iscsi_tcp at login",
			steps:    []*commandtest.Step{show, discover(), authNone(), loginFails(12, "iscsiadm: initiator reported error (12 - iSCSI driver not found. Please make sure it is loaded, and retry the operation)")},
			kind:     errdefs.ErrPrecondition,
			mentions: []string{"iscsi_tcp"},
		},
		{
			name:     "login refused: target not found",
			steps:    []*commandtest.Step{show, discover(), authNone(), loginFails(19, "iscsiadm: initiator reported error (19 - encountered non-retryable iSCSI login failure)")},
			kind:     errdefs.ErrNotFound,
			mentions: []string{kIQN, kInit, "ACL"},
		},
		{
			name: "discovery does not list the target",
			steps: []*commandtest.Step{show, iscsiadm("-m", "discovery", "-t", "sendtargets", "-p", kPortal, "-I", "spindle").
				Exits(21, "iscsiadm: No portals found")},
			kind:     errdefs.ErrNotFound,
			mentions: []string{kIQN, kPortal, kInit},
		},
		{
			name:     "iscsid not running",
			steps:    []*commandtest.Step{show, discover(), authNone(), loginFails(20, "iscsiadm: can not connect to iSCSI daemon (111)!\niscsiadm: initiator reported error (20 - could not connect to iscsid)")},
			kind:     errdefs.ErrUnavailable,
			mentions: []string{"iscsid"},
		},
		{
			name:     "portal unreachable",
			steps:    []*commandtest.Step{show, iscsiadm("-m", "discovery", "-t", "sendtargets", "-p", kPortal, "-I", "spindle").Exits(4, "iscsiadm: cannot make connection to 127.0.0.1: Connection refused\niscsiadm: connection login retries (reopen_max) 5 exceeded\niscsiadm: Could not perform SendTargets discovery: encountered connection failure")},
			kind:     errdefs.ErrUnavailable,
			mentions: []string{kPortal, "Connection refused"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newFakeNode(t, true)
			_, err := n.kernel(t, tt.steps...).Connect(t.Context(), kSession(nil))
			testutil.WantKind(t, err, tt.kind, tt.mentions...)
		})
	}
}

// A kernel without iscsi_tcp (kmod 30's modprobe on this machine's
// kernel): nothing but modprobe runs, and the precondition names the
// module and what modprobe said.
func TestKernelNoModule(t *testing.T) {
	const fatal = "modprobe: FATAL: Module iscsi_tcp not found in directory /lib/modules/6.18.44-fc-v782"
	n := newFakeNode(t, false)
	k := n.kernel(t,
		commandtest.Expect("modprobe", "iscsi_tcp").Exits(1, fatal),
		commandtest.Expect("modprobe", "iscsi_tcp").Exits(1, fatal))
	_, err := k.Connect(t.Context(), kSession(nil))
	testutil.WantKind(t, err, errdefs.ErrPrecondition, `"iscsi_tcp" kernel module`, "Module iscsi_tcp not found", "attachMode: userspace")
	testutil.WantKind(t, k.Probe(t.Context()), errdefs.ErrPrecondition, `"iscsi_tcp" kernel module`)
}

// A fresh node has not loaded iscsi_tcp yet (iscsid loads it at the first
// login): the probe loads it instead of failing the plugin's liveness.
func TestKernelProbeLoadsModule(t *testing.T) {
	n := newFakeNode(t, false)
	k := n.kernel(t, commandtest.Expect("modprobe", "iscsi_tcp").Does(func() {
		if err := os.MkdirAll(n.sys+"/module/iscsi_tcp", 0o755); err != nil {
			t.Error(err)
		}
	}))
	if err := k.Probe(t.Context()); err != nil && !strings.Contains(err.Error(), "iscsiadm is not installed") {
		t.Fatalf("Probe: %v", err)
	}
	if _, err := os.Stat(n.sys + "/module/iscsi_tcp"); err != nil {
		t.Errorf("iscsi_tcp not loaded after the probe: %v", err)
	}
}

// A disk whose serial is not the volume's is never handed out.
func TestKernelSerialMismatch(t *testing.T) {
	n := newFakeNode(t, true)
	n.disk(t, "sdd", kIQN, 1, "spindle-some-other-volume")
	k := n.kernel(t,
		iscsiadm("-m", "iface", "-I", "spindle", "-o", "show").Prints("iface.initiatorname = "+kInit+"\n"),
		iscsiadm("-m", "discovery", "-t", "sendtargets", "-p", kPortal, "-I", "spindle").Prints(kPortal+",1 "+kIQN+"\n"),
		iscsiadm(nodeArgs("-o", "update", "-n", "node.session.auth.authmethod", "-v", "None")...),
		iscsiadm(nodeArgs("--login")...),
		// The login was for this LUN alone: undone, nothing counted.
		iscsiadm(nodeArgs("--logout")...).Prints("Logout of [sid: 1, target: "+kIQN+", portal: 127.0.0.1,3260] successful.\n"),
		iscsiadm(nodeArgs("-o", "delete")...),
	)
	_, err := k.Connect(t.Context(), kSession(nil))
	testutil.WantKind(t, err, errdefs.ErrPrecondition, "sdd", "spindle-some-other-volume", kSerial)
	_, err = k.Identify(t.Context(), kIQN, kSerial, n.dev+"/sdd")
	testutil.WantKind(t, err, errdefs.ErrNotFound, "sdd")
	if refs, err := k.readRefs(); err != nil || len(refs) != 0 {
		t.Fatalf("session counts after a refused LUN = %v (%v), want none", refs, err)
	}
}

// A LUN already attached on this node stays counted, and its session up,
// when a second attach of it is refused (here: read-only over read-write).
func TestKernelRefusedReattachKeepsTheCount(t *testing.T) {
	n := newFakeNode(t, true)
	n.disk(t, "sdg", kIQN, 1, kSerial)
	k := n.kernel(t, loginToExistingSession()...)
	if err := k.writeRefs(sessionRefs{kIQN: {Portal: kPortal, LUNs: []int{1}}}); err != nil {
		t.Fatal(err)
	}
	readOnly := kSession(nil)
	readOnly.ReadOnly = true
	_, err := k.Connect(t.Context(), readOnly)
	testutil.WantKind(t, err, errdefs.ErrPrecondition, "read-only=false")
	refs, err := k.readRefs()
	if err != nil || refs[kIQN] == nil || !slices.Equal(refs[kIQN].LUNs, []int{1}) {
		t.Fatalf("session counts after a refused re-attach = %v (%v), want LUN 1 still counted", refs, err)
	}
}

// Session reference counting: with two LUNs of one target in use, the
// first detach removes its disk only, and a release then keeps the
// session; the logout comes with the release after the last.
func TestKernelLogoutOnlyWithTheLastLUN(t *testing.T) {
	n := newFakeNode(t, true)
	n.disk(t, "sde", kIQN, 1, kSerial)
	n.disk(t, "sdf", kIQN, 2, kSerial)
	k := n.kernel(t,
		iscsiadm(nodeArgs("--logout")...).Prints("Logout of [sid: 1, target: "+kIQN+", portal: 127.0.0.1,3260] successful.\n"),
		iscsiadm(nodeArgs("-o", "delete")...),
	)
	if err := k.writeRefs(sessionRefs{kIQN: {Portal: kPortal, LUNs: []int{1, 2}}}); err != nil {
		t.Fatal(err)
	}
	if err := k.Disconnect(t.Context(), kIQN, kSerial, n.dev+"/sde"); err != nil {
		t.Fatal(err)
	}
	if got := k.mustRefs(t); got[kIQN] == nil || len(got[kIQN].LUNs) != 1 || got[kIQN].LUNs[0] != 2 {
		t.Fatalf("after the first detach: %+v, want LUN 2 still counted", got[kIQN])
	}
	if data, _ := os.ReadFile(n.sys + "/block/sde/device/delete"); string(data) != "1" {
		t.Fatalf("sde was not removed from the kernel (device/delete = %q)", data)
	}
	// Had the first detach logged out, the script (logout, delete) would
	// have run early and the second detach's logout would fail the test.
	if err := k.Release(t.Context(), kIQN); err != nil {
		t.Fatalf("Release with LUN 2 still in use: %v", err)
	}
	if err := k.Disconnect(t.Context(), kIQN, kSerial, n.dev+"/sdf"); err != nil {
		t.Fatal(err)
	}
	if err := k.Release(t.Context(), kIQN); err != nil {
		t.Fatal(err)
	}
	if got := k.mustRefs(t); len(got) != 0 {
		t.Fatalf("session counts after the last detach = %+v", got)
	}
}

func (k *kernel) mustRefs(t *testing.T) sessionRefs {
	t.Helper()
	refs, err := k.readRefs()
	if err != nil {
		t.Fatal(err)
	}
	return refs
}

// CHAP values never reach an error, even when setting them fails.
func TestKernelCHAPNeverInErrors(t *testing.T) {
	n := newFakeNode(t, true)
	k := n.kernel(t,
		iscsiadm("-m", "iface", "-I", "spindle", "-o", "show").Prints("iface.initiatorname = "+kInit+"\n"),
		iscsiadm("-m", "discovery", "-t", "sendtargets", "-p", kPortal, "-I", "spindle").Prints(kPortal+",1 "+kIQN+"\n"),
		iscsiadm(nodeArgs("-o", "update", "-n", "node.session.auth.authmethod", "-v", "CHAP")...),
		iscsiadm(nodeArgs("-o", "update", "-n", "node.session.auth.username", "-v", "alice")...),
		iscsiadm(nodeArgs("-o", "update", "-n", "node.session.auth.password", "-v", "hunter2-secret")...).Exits(7, "iscsiadm: could not set hunter2-secret"),
	)
	_, err := k.Connect(t.Context(), kSession(&CHAP{User: "alice", Password: "hunter2-secret"}))
	testutil.WantKind(t, err, errdefs.ErrUnavailable, SecretPassword)
	if strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("the error shows the password: %v", err)
	}
}
