package iscsi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

const lIQN = "iqn.2026-01.dev.spindle:test.pvc-l"

// fakeConfigfs is LIO's configfs tree as targetcli leaves it.
type fakeConfigfs struct{ root string }

func newFakeConfigfs(t *testing.T) *fakeConfigfs {
	f := &fakeConfigfs{root: filepath.Join(t.TempDir(), "target")}
	if err := os.MkdirAll(filepath.Join(f.root, "iscsi"), 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fakeConfigfs) mkdir(t *testing.T, rel string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(f.root, rel), 0o755); err != nil {
		t.Fatal(err)
	}
}

// published makes the tree of a target with LUN 1 on backstore name and
// an ACL per initiator.
func (f *fakeConfigfs) published(t *testing.T, name string, initiators ...string) {
	t.Helper()
	f.mkdir(t, "core/fileio_1/"+name)
	f.mkdir(t, "iscsi/"+lIQN+"/tpgt_1/lun/lun_1")
	if err := os.Symlink("../../../../../../target/core/fileio_1/"+name, filepath.Join(f.root, "iscsi", lIQN, "tpgt_1", "lun", "lun_1", "0123456789")); err != nil {
		t.Fatal(err)
	}
	for _, i := range initiators {
		f.mkdir(t, "iscsi/"+lIQN+"/tpgt_1/acls/"+i)
	}
}

func (f *fakeConfigfs) lio(t *testing.T, steps ...*commandtest.Step) *lio {
	l := newLIO(command.New(commandtest.New(t, steps...), nil))
	l.configfs = f.root
	return l
}

func targetcli(args ...string) *commandtest.Step { return commandtest.Expect("targetcli", args...) }

// A new export on LIO: targetcli-fb's command sequence, the CHAP
// credentials on stdin only, saveconfig last.
func TestLIOApplyNewTarget(t *testing.T) {
	f := newFakeConfigfs(t)
	x := Export{
		IQN: lIQN, ImagePath: "/pool/pvc-l.img", Serial: "spindlel",
		Initiators: []string{"iqn.2026-01.dev.spindle.node:node-a"},
		CHAP:       &CHAP{User: "alice", Password: "pw-a", MutualUser: "tgt", MutualPassword: "pw-t"},
	}
	tpg := "/iscsi/" + lIQN + "/tpg1"
	l := f.lio(t,
		targetcli("/backstores/fileio", "create", "name=spindlel", "file_or_dev=/pool/pvc-l.img", "write_back=false", "wwn=spindlel"),
		targetcli("/iscsi", "create", lIQN),
		targetcli(tpg, "set", "attribute", "generate_node_acls=0", "demo_mode_write_protect=1", "demo_mode_discovery=0"),
		targetcli(tpg+"/luns", "create", "/backstores/fileio/spindlel", "lun=1", "add_mapped_luns=false"),
		targetcli(tpg+"/acls", "create", "iqn.2026-01.dev.spindle.node:node-a", "add_mapped_luns=true"),
		targetcli(tpg, "set", "attribute", "authentication=1"),
		targetcli().Reads(tpg+"/acls/iqn.2026-01.dev.spindle.node:node-a set auth userid=alice password=pw-a mutual_userid=tgt mutual_password=pw-t\nexit\n"),
		targetcli("saveconfig"),
	)
	if err := l.Apply(t.Context(), x); err != nil {
		t.Fatal(err)
	}
}

// Re-applying changes only the ACL (deleting a node ACL also ends that
// initiator's sessions in LIO); keepCHAP leaves authentication alone.
func TestLIOApplyACLChange(t *testing.T) {
	f := newFakeConfigfs(t)
	f.published(t, "spindlel", "iqn.2026-01.dev.spindle.node:node-a", "iqn.2026-01.dev.spindle.node:node-b")
	tpg := "/iscsi/" + lIQN + "/tpg1"
	l := f.lio(t,
		targetcli(tpg+"/acls", "delete", "iqn.2026-01.dev.spindle.node:node-a"),
		targetcli(tpg+"/acls", "create", "iqn.2026-01.dev.spindle.node:node-c", "add_mapped_luns=true"),
		targetcli("saveconfig"),
	)
	x := keepCHAP(Export{IQN: lIQN, ImagePath: "/pool/pvc-l.img", Serial: "spindlel",
		Initiators: []string{"iqn.2026-01.dev.spindle.node:node-b", "iqn.2026-01.dev.spindle.node:node-c"}})
	if err := l.Apply(t.Context(), x); err != nil {
		t.Fatal(err)
	}
}

func TestLIORemove(t *testing.T) {
	f := newFakeConfigfs(t)
	f.published(t, "spindlel", "iqn.2026-01.dev.spindle.node:node-a")
	l := f.lio(t,
		targetcli("/iscsi", "delete", lIQN),
		targetcli("/backstores/fileio", "delete", "spindlel"),
		targetcli("saveconfig"),
	)
	if err := l.Remove(t.Context(), lIQN); err != nil {
		t.Fatal(err)
	}
	// A target that is not there: nothing to run.
	if err := f.lio(t).Remove(t.Context(), "iqn.2026-01.dev.spindle:test.gone"); err != nil {
		t.Fatal(err)
	}
}

// What this machine has: no configfs. Every operation says so, naming the
// path, and runs no targetcli (which fails there too).
func TestLIOWithoutConfigfs(t *testing.T) {
	l := newLIO(command.New(commandtest.New(t), nil))
	l.configfs = filepath.Join(t.TempDir(), "no-configfs")
	testutil.WantKind(t, l.Probe(t.Context()), errdefs.ErrUnavailable, "no-configfs", "configfs")
	testutil.WantKind(t, l.Apply(t.Context(), Export{IQN: lIQN}), errdefs.ErrUnavailable, "configfs")
}

// A published LIO LUN grows in place: the image file's size goes to the
// backstore's control attribute (fd_dev_size, read on every READ
// CAPACITY), then saveconfig. An unpublished volume has nothing to resize.
func TestLIOResize(t *testing.T) {
	f := newFakeConfigfs(t)
	f.published(t, "spindlel")
	image := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(image, 24<<20); err != nil {
		t.Fatal(err)
	}
	x := Export{IQN: lIQN, Serial: "spindlel", ImagePath: image}
	if err := f.lio(t, targetcli("saveconfig")).Resize(t.Context(), x); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(f.root, "core/fileio_1/spindlel/control"))
	if err != nil || string(got) != "fd_dev_size=25165824" {
		t.Fatalf("control = %q, %v; want fd_dev_size=25165824", got, err)
	}
	if err := f.lio(t).Resize(t.Context(), Export{IQN: "iqn.2026-01.dev.spindle:test.unpublished"}); err != nil {
		t.Fatalf("Resize of an unpublished volume: %v", err)
	}
	// A target whose backstore is gone: an error naming both, no saveconfig.
	err = f.lio(t).Resize(t.Context(), Export{IQN: lIQN, Serial: "other", ImagePath: image})
	if err == nil || !strings.Contains(err.Error(), lIQN) || !strings.Contains(err.Error(), "other") {
		t.Fatalf("Resize without a backstore = %v, want an error naming %s and the backstore", err, lIQN)
	}
}
