package iscsi

import (
	"context"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// tgtShowOneTarget is tgtadm 1.0.85's "--mode target --op show" for a
// target with LUN 1, one session, a CHAP account, a mutual one and an ACL
// of two initiators, as it printed on this project's machine.
const tgtShowOneTarget = `Target 1: iqn.2026-01.dev.spindle:test.pvc-a
    System information:
        Driver: iscsi
        State: ready
    I_T nexus information:
        I_T nexus: 10
            Initiator: iqn.2026-01.dev.spindle.node:node-b alias: none
            Connection: 0
                IP Address: 127.0.0.1
    LUN information:
        LUN: 0
            Type: controller
            SCSI ID: IET     00010000
            SCSI SN: beaf10
            Size: 0 MB, Block size: 1
            Online: Yes
            Removable media: No
            Prevent removal: No
            Readonly: No
            SWP: No
            Thin-provisioning: No
            Backing store type: null
            Backing store path: None
            Backing store flags: 
        LUN: 1
            Type: disk
            SCSI ID: spindle0123456789abcdef01234567
            SCSI SN: spindle0123456789abcdef01234567
            Size: 67 MB, Block size: 512
            Online: Yes
            Removable media: No
            Prevent removal: No
            Readonly: No
            SWP: No
            Thin-provisioning: No
            Backing store type: rdwr
            Backing store path: /pool/pvc-a.img
            Backing store flags: 
    Account information:
        alice
        tgtuser (outgoing)
    ACL information:
        iqn.2026-01.dev.spindle.node:node-a
        iqn.2026-01.dev.spindle.node:node-b
Target 3: iqn.2026-01.dev.spindle:test.pvc-b
    System information:
        Driver: iscsi
        State: ready
    I_T nexus information:
    LUN information:
        LUN: 0
            Type: controller
            Backing store path: None
    Account information:
    ACL information:
        ALL
`

func TestParseTgtShow(t *testing.T) {
	got, err := parseTgtShow(tgtShowOneTarget)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].TID != 1 || got[1].TID != 3 || got[1].IQN != "iqn.2026-01.dev.spindle:test.pvc-b" {
		t.Fatalf("targets = %+v", got)
	}
	a := got[0]
	if l := a.LUNs[1]; l.Path != "/pool/pvc-a.img" || l.Serial != "spindle0123456789abcdef01234567" {
		t.Errorf("LUN 1 = %+v", l)
	}
	if len(a.Accounts) != 2 || a.Accounts[0] != (tgtAccount{User: "alice"}) || a.Accounts[1] != (tgtAccount{User: "tgtuser", Outgoing: true}) {
		t.Errorf("accounts = %+v", a.Accounts)
	}
	if len(a.ACL) != 2 || a.ACL[1] != "iqn.2026-01.dev.spindle.node:node-b" {
		t.Errorf("ACL = %v", a.ACL)
	}
	if len(a.Nexus) != 1 || a.Nexus[0].SID != 10 || a.Nexus[0].Initiator != "iqn.2026-01.dev.spindle.node:node-b" || len(a.Nexus[0].CIDs) != 1 {
		t.Errorf("nexus = %+v", a.Nexus)
	}
	if _, ok := got[1].LUNs[1]; ok || len(got[1].ACL) != 1 || got[1].ACL[0] != "ALL" {
		t.Errorf("target 3 = %+v", got[1])
	}
	if _, err := parseTgtShow("    LUN information:\n"); err == nil {
		t.Error("a section before any target was accepted")
	}
}

const sock = "/run/t/tgtd.socket"

func scriptedTgt(t *testing.T, steps ...*commandtest.Step) *tgt {
	return newTgt(command.New(commandtest.New(t, steps...), nil), sock)
}

func adm(args ...string) *commandtest.Step {
	return commandtest.Expect("tgtadm", append([]string{"--lld", "iscsi"}, args...)...)
}

var showTargets = []string{"--mode", "target", "--op", "show"}

// Applying a new export: the lowest free tid (2: tids 1 and 3 are taken),
// LUN 1 on the image with its serial, the ACL, a new CHAP account bound.
func TestTgtApplyNewTarget(t *testing.T) {
	x := Export{
		IQN: "iqn.2026-01.dev.spindle:test.pvc-c", ImagePath: "/pool/pvc-c.img", Serial: "spindleabc",
		Initiators: []string{"iqn.2026-01.dev.spindle.node:node-a"},
		CHAP:       &CHAP{User: "bob", Password: "pw-bob-123"},
	}
	tool := scriptedTgt(t,
		adm(showTargets...).Prints(tgtShowOneTarget),
		adm("--mode", "target", "--op", "new", "--tid", "2", "--targetname", x.IQN),
		adm("--mode", "logicalunit", "--op", "new", "--tid", "2", "--lun", "1", "--backing-store", "/pool/pvc-c.img", "--bstype", "rdwr"),
		adm("--mode", "logicalunit", "--op", "update", "--tid", "2", "--lun", "1", "--params", "scsi_sn=spindleabc,scsi_id=spindleabc"),
		adm("--mode", "target", "--op", "bind", "--tid", "2", "--initiator-name", "iqn.2026-01.dev.spindle.node:node-a"),
		adm("--mode", "account", "--op", "show").Prints("Account list:\n    tgtuser\n    alice\n"),
		adm("--mode", "account", "--op", "new", "--user", "bob", "--password", "pw-bob-123"),
		adm("--mode", "account", "--op", "bind", "--tid", "2", "--user", "bob"),
	)
	if err := tool.Apply(t.Context(), x); err != nil {
		t.Fatal(err)
	}
}

// Re-applying an existing target fixes only what differs: the ACL loses
// node-b (and node-b's session is cut), mutual CHAP goes, nothing else runs.
func TestTgtApplyRepairsDrift(t *testing.T) {
	x := Export{
		IQN: "iqn.2026-01.dev.spindle:test.pvc-a", ImagePath: "/pool/pvc-a.img", Serial: "spindle0123456789abcdef01234567",
		Initiators: []string{"iqn.2026-01.dev.spindle.node:node-a"},
		CHAP:       &CHAP{User: "alice", Password: "pw-alice-1"},
	}
	tool := scriptedTgt(t,
		adm(showTargets...).Prints(tgtShowOneTarget),
		adm("--mode", "target", "--op", "unbind", "--tid", "1", "--initiator-name", "iqn.2026-01.dev.spindle.node:node-b"),
		adm("--mode", "conn", "--op", "delete", "--tid", "1", "--sid", "10", "--cid", "0"),
		adm("--mode", "account", "--op", "unbind", "--tid", "1", "--user", "tgtuser", "--outgoing"),
		adm("--mode", "account", "--op", "show").Prints("Account list:\n    tgtuser\n    alice\n"),
	)
	if err := tool.Apply(t.Context(), x); err != nil {
		t.Fatal(err)
	}
}

// An ACL entry that is not an initiator name ("ALL", an address) would let
// anyone in: it goes. An export that keeps CHAP touches no account. The
// LUN is created since the target has none.
func TestTgtApplyRemovesAddressACLAndKeepsCHAP(t *testing.T) {
	x := keepCHAP(Export{IQN: "iqn.2026-01.dev.spindle:test.pvc-b", ImagePath: "/pool/pvc-b.img", Serial: "spindleb", DirectIO: true})
	tool := scriptedTgt(t,
		adm(showTargets...).Prints(tgtShowOneTarget),
		adm("--mode", "logicalunit", "--op", "new", "--tid", "3", "--lun", "1", "--backing-store", "/pool/pvc-b.img", "--bstype", "rdwr", "--bsoflags", "direct"),
		adm("--mode", "logicalunit", "--op", "update", "--tid", "3", "--lun", "1", "--params", "scsi_sn=spindleb,scsi_id=spindleb"),
		adm("--mode", "target", "--op", "unbind", "--tid", "3", "--initiator-address", "ALL"),
	)
	if err := tool.Apply(t.Context(), x); err != nil {
		t.Fatal(err)
	}
}

func TestTgtRemoveAndResize(t *testing.T) {
	t.Run("remove forces the target out", func(t *testing.T) {
		tool := scriptedTgt(t,
			adm(showTargets...).Prints(tgtShowOneTarget),
			adm("--mode", "target", "--op", "delete", "--force", "--tid", "3"),
		)
		if err := tool.Remove(t.Context(), "iqn.2026-01.dev.spindle:test.pvc-b"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("remove of a missing target", func(t *testing.T) {
		tool := scriptedTgt(t, adm(showTargets...).Prints(tgtShowOneTarget))
		if err := tool.Remove(t.Context(), "iqn.2026-01.dev.spindle:test.gone"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("resize re-adds LUN 1", func(t *testing.T) {
		x := Export{IQN: "iqn.2026-01.dev.spindle:test.pvc-a", ImagePath: "/pool/pvc-a.img", Serial: "spindle0123456789abcdef01234567"}
		tool := scriptedTgt(t,
			adm(showTargets...).Prints(tgtShowOneTarget),
			adm("--mode", "logicalunit", "--op", "delete", "--tid", "1", "--lun", "1"),
			adm("--mode", "logicalunit", "--op", "new", "--tid", "1", "--lun", "1", "--backing-store", "/pool/pvc-a.img", "--bstype", "rdwr"),
			adm("--mode", "logicalunit", "--op", "update", "--tid", "1", "--lun", "1", "--params", "scsi_sn="+x.Serial+",scsi_id="+x.Serial),
		)
		if err := tool.Resize(t.Context(), x); err != nil {
			t.Fatal(err)
		}
	})
}

// tgtd not running: the error is unavailable and names the socket.
func TestTgtUnreachable(t *testing.T) {
	tool := scriptedTgt(t, adm("--mode", "sys", "--op", "show").
		Exits(107, "tgtadm: can't send the request to the tgt daemon, Transport endpoint is not connected"))
	testutil.WantKind(t, tool.Probe(t.Context()), errdefs.ErrUnavailable, sock)
}

// A failing account creation never shows the password (tgtadm forces it
// onto its command line; our errors and logs keep it out).
func TestTgtAccountPasswordNeverInErrors(t *testing.T) {
	x := Export{IQN: "iqn.2026-01.dev.spindle:test.pvc-b", ImagePath: "/pool/pvc-b.img", Serial: "spindleb",
		CHAP: &CHAP{User: "carol", Password: "very-secret-pw"}}
	var observed []command.Observation
	script := commandtest.New(t,
		adm(showTargets...).Prints(strings.Replace(tgtShowOneTarget, "        ALL\n", "", 1)),
		adm("--mode", "logicalunit", "--op", "new", "--tid", "3", "--lun", "1", "--backing-store", "/pool/pvc-b.img", "--bstype", "rdwr"),
		adm("--mode", "logicalunit", "--op", "update", "--tid", "3", "--lun", "1", "--params", "scsi_sn=spindleb,scsi_id=spindleb"),
		adm("--mode", "account", "--op", "show").Prints("Account list:\n"),
		adm("--mode", "account", "--op", "new", "--user", "carol", "--password", "very-secret-pw").Exits(22, "tgtadm: out of memory"),
	)
	tool := newTgt(command.New(script, func(o command.Observation) { observed = append(observed, o) }), sock)
	err := tool.Apply(context.Background(), x)
	if err == nil || strings.Contains(err.Error(), "very-secret-pw") {
		t.Fatalf("error = %v; want a failure without the password", err)
	}
	for _, o := range observed {
		if strings.Contains(strings.Join(o.Args, " "), "very-secret-pw") {
			t.Fatalf("an observation (what debug logs show) carries the password: %v", o.Args)
		}
	}
}

// Another process took the free tid between listing and creating: list
// again and take the next one.
func TestTgtApplyRetriesATakenTID(t *testing.T) {
	x := keepCHAP(Export{IQN: "iqn.2026-01.dev.spindle:test.pvc-r", ImagePath: "/pool/pvc-r.img", Serial: "spindler"})
	taken := tgtShowOneTarget + "Target 2: iqn.2026-01.dev.spindle:other.pvc-z\n    System information:\n"
	tool := scriptedTgt(t,
		adm(showTargets...).Prints(tgtShowOneTarget),
		adm("--mode", "target", "--op", "new", "--tid", "2", "--targetname", x.IQN).Exits(22, "tgtadm: this target already exists"),
		adm(showTargets...).Prints(taken),
		adm("--mode", "target", "--op", "new", "--tid", "4", "--targetname", x.IQN),
		adm("--mode", "logicalunit", "--op", "new", "--tid", "4", "--lun", "1", "--backing-store", "/pool/pvc-r.img", "--bstype", "rdwr"),
		adm("--mode", "logicalunit", "--op", "update", "--tid", "4", "--lun", "1", "--params", "scsi_sn=spindler,scsi_id=spindler"),
	)
	if err := tool.Apply(t.Context(), x); err != nil {
		t.Fatal(err)
	}
}
