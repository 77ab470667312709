//go:build root

package iscsi_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/conformance"
	"github.com/spindle-csi/spindle/internal/backend/filestore"
	"github.com/spindle-csi/spindle/internal/backend/iscsi"
	"github.com/spindle-csi/spindle/internal/backend/iscsi/iscsitest"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// chapSecrets are the CSI secrets the real tests publish and attach with.
var chapSecrets = map[string]string{
	iscsi.SecretUser:     "spindle-test",
	iscsi.SecretPassword: "not-a-real-secret-1",
}

// realEnv is an iSCSI instance on a target of its own (tgtd or LIO),
// attached with the initiator of the run's mode (iscsitest.ModeFromEnv),
// split as a deployment splits it: the controller's roles (store, export,
// snapshots) on the pool, the node's attacher from an instance whose
// configured pool directory does not exist, and which must never appear.
type realEnv struct {
	inst   *backend.Instance
	ctrl   *backend.Instance
	store  *filestore.Store
	cfg    iscsi.Config
	target *iscsitest.Target
	// nodePool is the node instance's poolDir.
	nodePool string
}

func newRealEnv(t *testing.T, maxBytes int64) *realEnv {
	t.Helper()
	target := iscsitest.StartTarget(t)
	cfg := target.Config(t, filepath.Join(t.TempDir(), "pool"))
	cfg.MaxProvisionedBytes = maxBytes
	run := command.New(utilexec.New(), nil)
	ctrl, err := iscsi.New("test", cfg, run)
	if err != nil {
		t.Fatal(err)
	}
	nodeCfg := cfg
	nodeCfg.PoolDir = filepath.Join(t.TempDir(), "no-pool-on-the-node")
	node, err := iscsi.New("test", nodeCfg, run)
	if err != nil {
		t.Fatal(err)
	}
	store, err := ctrl.Store.(*iscsi.Store).Pool()
	if err != nil {
		t.Fatal(err)
	}
	inst := *ctrl
	inst.Attacher = node.Attacher
	e := &realEnv{inst: &inst, ctrl: ctrl, store: store, cfg: cfg, target: target, nodePool: nodeCfg.PoolDir}
	t.Cleanup(func() {
		if _, err := os.Lstat(e.nodePool); !os.IsNotExist(err) {
			t.Errorf("the node's pool directory %s exists (%v): the node plugin must never touch it", e.nodePool, err)
		}
	})
	// Registered after the target's stop, so it runs before it: nothing of the
	// test may be left attached.
	iscsitest.CheckNoLeaks(t, cfg.StateDir)
	return e
}

func (e *realEnv) fixture() *conformance.Fixture {
	return &conformance.Fixture{
		Instance: e.inst,
		// What a node plugin in the controller's process (--mode=all)
		// does; a controller on its own knows no nodes.
		RegisterNode: e.ctrl.Attacher.RegisterNode,
		ImageID:      filestore.ImageIDForName,
		Artifacts:    e.artifacts,
		WriteImage:   e.writeImage,
		ReadImage:    e.readImage,
		Secrets:      chapSecrets,
		// Conformance only modifies; TestDirectIOReachesTgt attaches one.
		MutableParameters: map[string]string{iscsi.MutableParamDirectIO: "true"},
		NodeWithoutStore:  "an iSCSI node has only the target's portal, the publish_context and the CHAP secret",
		Format:            e.format,
	}
}

// TestConformance runs the shared suite against a real target, attaching
// with the run's initiator (by default tgtd and qemu-storage-daemon + FUSE
// + loop), with CHAP on every publish and attach, from a node instance
// without a pool. The small-capacity variant is a provisioning cap.
func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T, opts conformance.Options) *conformance.Fixture {
		return newRealEnv(t, opts.CapacityBytes).fixture()
	})
}

// format makes an ext4 filesystem in the image file, as a node's mkfs on
// its device would.
func (e *realEnv) format(ctx context.Context, id, fsType string) error {
	if fsType != "ext4" {
		return fmt.Errorf("the tests format ext4 only, not %s", fsType)
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", e.store.ImagePath(id)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4: %v: %s", err, out)
	}
	return nil
}

func (e *realEnv) writeImage(_ context.Context, id string, off int64, data []byte) error {
	f, err := os.OpenFile(e.store.ImagePath(id), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		return err
	}
	return f.Sync()
}

func (e *realEnv) readImage(_ context.Context, id string, off int64, n int) ([]byte, error) {
	f, err := os.Open(e.store.ImagePath(id))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, n)
	_, err = f.ReadAt(buf, off)
	return buf, err
}

// artifacts lists the pool's entries with their sizes and the target's
// iSCSI targets.
func (e *realEnv) artifacts(context.Context) ([]string, error) {
	var out []string
	err := filepath.WalkDir(e.store.Dir(), func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == e.store.Dir() {
			return err
		}
		rel, _ := filepath.Rel(e.store.Dir(), p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			out = append(out, rel+"/")
		} else {
			out = append(out, fmt.Sprintf("%s %d", rel, info.Size()))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	iqns, err := e.target.TargetIQNs()
	for _, iqn := range iqns {
		out = append(out, "target "+iqn)
	}
	return out, err
}

// published creates a volume and publishes it to node with CHAP.
func (e *realEnv) published(t *testing.T, name, node string, mode backend.AccessMode) (*backend.Image, map[string]string) {
	t.Helper()
	ctx := backend.WithSecrets(t.Context(), chapSecrets)
	if err := e.inst.Attacher.RegisterNode(ctx, backend.NodeInfo{NodeID: node}); err != nil {
		t.Fatal(err)
	}
	img, err := e.inst.Store.Create(ctx, backend.VolumeSpec{Name: name, CapacityBytes: 8 << 20, AccessType: backend.AccessBlock})
	if err != nil {
		t.Fatal(err)
	}
	pc, err := e.inst.Exporter.Publish(ctx, img.ID, backend.Attachment{NodeID: node, AccessMode: mode, Since: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return img, pc
}

// iscsiURL is libiscsi's URL of a LUN, with credentials when given.
func iscsiURL(portal, iqn, user, password string) string {
	cred := ""
	if user != "" {
		cred = user + "%" + password + "@"
	}
	return fmt.Sprintf("iscsi://%s%s/%s/%d", cred, portal, iqn, iscsi.LUN)
}

func runTool(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestACLAndCHAPFromTheInitiatorSide checks with libiscsi's own tools, not
// through the code under test, what the target lets through: the published
// node's initiator with the right CHAP secret sees LUN 1; another initiator
// does not even discover the target; a wrong password is refused; after
// unpublish nobody gets in and the target is gone.
func TestACLAndCHAPFromTheInitiatorSide(t *testing.T) {
	testutil.RequireCommands(t, "iscsi-inq", "iscsi-ls")
	e := newRealEnv(t, 0)
	img, pc := e.published(t, "pvc-acl", "node-a", backend.SingleNodeWriter)
	iqn := pc[iscsi.ContextTargetIQN]
	nodeA := iscsitest.InitiatorPrefix + ":node-a"
	nodeB := iscsitest.InitiatorPrefix + ":node-b"
	user, pass := chapSecrets[iscsi.SecretUser], chapSecrets[iscsi.SecretPassword]
	// An initiator outside the ACL: tgt answers the login "not found", LIO
	// "authorization failure" (iSCSI login status 0x0203 / 0x0202).
	refusedLogin := "Target not found(515)"
	if e.target.Mode.Target == iscsi.ToolLIO {
		refusedLogin = "Authorization failure(514)"
	}

	tests := []struct {
		name      string
		tool      string
		args      []string
		want      string // in the output
		forbidden string // never in the output
	}{
		{"published node sees the LUN", "iscsi-inq", []string{"-i", nodeA, iscsiURL(e.target.Portal, iqn, user, pass)}, "Peripheral Device Type:DIRECT_ACCESS", ""},
		{"published node lists the target", "iscsi-ls", []string{"-i", nodeA, "-s", "iscsi://" + user + "%" + pass + "@" + e.target.Portal}, "Target:" + iqn, ""},
		{"other node cannot log in", "iscsi-inq", []string{"-i", nodeB, iscsiURL(e.target.Portal, iqn, user, pass)}, refusedLogin, "DIRECT_ACCESS"},
		{"other node does not discover it", "iscsi-ls", []string{"-i", nodeB, "-s", "iscsi://" + user + "%" + pass + "@" + e.target.Portal}, "", iqn},
		{"wrong CHAP password is refused", "iscsi-inq", []string{"-i", nodeA, iscsiURL(e.target.Portal, iqn, user, "wrong-password-1")}, "Authentication failure(513)", "DIRECT_ACCESS"},
		{"no CHAP is refused", "iscsi-inq", []string{"-i", nodeA, iscsiURL(e.target.Portal, iqn, "", "")}, "", "DIRECT_ACCESS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, _ := runTool(t, tt.tool, tt.args...)
			if tt.want != "" && !strings.Contains(out, tt.want) {
				t.Errorf("%s printed\n%s\nwant %q in it", tt.tool, out, tt.want)
			}
			if tt.forbidden != "" && strings.Contains(out, tt.forbidden) {
				t.Errorf("%s printed\n%s\nwhich must not contain %q", tt.tool, out, tt.forbidden)
			}
		})
	}

	if err := e.inst.Exporter.Unpublish(t.Context(), img.ID, "node-a"); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(e.target.Targets(t), iqn) {
		t.Fatalf("target %s still exists after its only node was unpublished", iqn)
	}
	if out, _ := runTool(t, "iscsi-inq", "-i", nodeA, iscsiURL(e.target.Portal, iqn, user, pass)); strings.Contains(out, "DIRECT_ACCESS") {
		t.Fatalf("the unpublished node still sees the LUN:\n%s", out)
	}
}

// TestReconcileAfterTgtdRestart: a tgtd restart loses every target.
// Reconcile rebuilds the targets of published volumes from the pool; one
// published with CHAP comes back locked (no initiator may log in, since
// the pool keeps no password) until the next publish brings the secrets;
// a target of this instance that no published volume owns goes.
func TestReconcileAfterTgtdRestart(t *testing.T) {
	e := newRealEnv(t, 0)
	ctx := t.Context()
	plain, err := e.inst.Store.Create(ctx, backend.VolumeSpec{Name: "pvc-plain", CapacityBytes: 8 << 20, AccessType: backend.AccessBlock})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.inst.Attacher.RegisterNode(ctx, backend.NodeInfo{NodeID: "node-a"}); err != nil {
		t.Fatal(err)
	}
	pcPlain, err := e.inst.Exporter.Publish(ctx, plain.ID, backend.Attachment{NodeID: "node-a", AccessMode: backend.SingleNodeWriter})
	if err != nil {
		t.Fatal(err)
	}
	chapped, pcCHAP := e.published(t, "pvc-chap", "node-a", backend.SingleNodeWriter)

	e.target.Restart(t)
	if got := e.target.Targets(t); len(got) != 0 {
		t.Fatalf("targets after a tgtd restart = %v", got)
	}
	// A stray target of this instance, as an interrupted unpublish leaves.
	stray := iscsi.TargetIQN(e.cfg.TargetPrefix, "test", "pvc-stray")
	cmd := exec.Command("tgtadm", "--lld", "iscsi", "--mode", "target", "--op", "new", "--tid", "9", "--targetname", stray)
	cmd.Env = append(os.Environ(), "TGT_IPC_SOCKET="+e.target.Socket)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}

	if _, err := e.inst.Store.(backend.Reconciler).Reconcile(ctx); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	got := e.target.Targets(t)
	slices.Sort(got)
	want := []string{pcCHAP[iscsi.ContextTargetIQN], pcPlain[iscsi.ContextTargetIQN]}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("targets after Reconcile = %v, want %v", got, want)
	}
	nodeA := iscsitest.InitiatorPrefix + ":node-a"
	user, pass := chapSecrets[iscsi.SecretUser], chapSecrets[iscsi.SecretPassword]
	if out, _ := runTool(t, "iscsi-inq", "-i", nodeA, iscsiURL(e.target.Portal, pcPlain[iscsi.ContextTargetIQN], "", "")); !strings.Contains(out, "DIRECT_ACCESS") {
		t.Fatalf("the rebuilt plain target does not serve node-a:\n%s", out)
	}
	if out, _ := runTool(t, "iscsi-inq", "-i", nodeA, iscsiURL(e.target.Portal, pcCHAP[iscsi.ContextTargetIQN], user, pass)); strings.Contains(out, "DIRECT_ACCESS") {
		t.Fatalf("the CHAP target came back open before its credentials did:\n%s", out)
	}
	// A publish without the credentials may not open it either.
	_, err = e.inst.Exporter.Publish(ctx, chapped.ID, backend.Attachment{NodeID: "node-a", AccessMode: backend.SingleNodeWriter})
	if err == nil || !strings.Contains(err.Error(), "CHAP") {
		t.Fatalf("a publish without CHAP secrets of a CHAP volume = %v, want a refusal", err)
	}
	// The repeated publish with them (as the external-attacher retries) restores it.
	if _, err := e.inst.Exporter.Publish(backend.WithSecrets(ctx, chapSecrets), chapped.ID, backend.Attachment{NodeID: "node-a", AccessMode: backend.SingleNodeWriter}); err != nil {
		t.Fatal(err)
	}
	if out, _ := runTool(t, "iscsi-inq", "-i", nodeA, iscsiURL(e.target.Portal, pcCHAP[iscsi.ContextTargetIQN], user, pass)); !strings.Contains(out, "DIRECT_ACCESS") {
		t.Fatalf("the CHAP target is still locked after a publish with its secrets:\n%s", out)
	}
	if out, _ := runTool(t, "iscsi-inq", "-i", nodeA, iscsiURL(e.target.Portal, pcCHAP[iscsi.ContextTargetIQN], "", "")); strings.Contains(out, "DIRECT_ACCESS") {
		t.Fatalf("the CHAP target lets node-a in without CHAP:\n%s", out)
	}
}

// The attacher's refusals, with the real initiator's login errors.
func TestAttachRefusals(t *testing.T) {
	e := newRealEnv(t, 0)
	img, pc := e.published(t, "pvc-refuse", "node-a", backend.SingleNodeWriter)
	req := backend.AttachRequest{ImageID: img.ID, NodeID: "node-a", PublishContext: pc}
	type refusal struct {
		name     string
		secrets  map[string]string
		kind     error
		mentions []string
	}
	tests := []refusal{
		{"wrong CHAP password", map[string]string{iscsi.SecretUser: chapSecrets[iscsi.SecretUser], iscsi.SecretPassword: "wrong-password-1"},
			errdefs.ErrPrecondition, []string{"CHAP authentication", pc[iscsi.ContextTargetIQN]}},
		{"no CHAP", nil, errdefs.ErrPrecondition, []string{pc[iscsi.ContextTargetIQN]}},
	}
	if e.target.Mode.Attach == iscsi.ModeUserspace {
		// qemu's iSCSI client has no mutual CHAP; the kernel's has.
		tests = append(tests, refusal{"mutual CHAP", map[string]string{iscsi.SecretUser: "u", iscsi.SecretPassword: "p", iscsi.SecretMutualUser: "m", iscsi.SecretMutualPassword: "q"},
			errdefs.ErrPrecondition, []string{"mutual CHAP", "kernel"}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.inst.Attacher.Attach(backend.WithSecrets(t.Context(), tt.secrets), req)
			testutil.WantKind(t, err, tt.kind, tt.mentions...)
			for _, k := range []string{iscsi.SecretPassword, iscsi.SecretMutualPassword} {
				if v := tt.secrets[k]; len(v) > 3 && strings.Contains(err.Error(), v) {
					t.Fatalf("the error shows %s: %v", k, err)
				}
			}
			if devs, _ := e.inst.Attacher.Devices(t.Context(), img.ID); len(devs) != 0 {
				t.Fatalf("a refused attach left devices %v", devs)
			}
		})
	}
	// Another node's initiator is not in the ACL.
	if err := e.inst.Attacher.RegisterNode(t.Context(), backend.NodeInfo{NodeID: "node-b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.inst.Exporter.Publish(backend.WithSecrets(t.Context(), chapSecrets), img.ID, backend.Attachment{NodeID: "node-b", AccessMode: backend.SingleNodeWriter}); errdefs.KindOf(err) != errdefs.ErrPrecondition {
		t.Fatalf("publish to a second node of an RWO volume = %v, want a precondition", err)
	}
}

// TestDirectIOReachesTgt: a volume whose mutable directIO is "true" gets a
// LUN that tgtd opens with O_DIRECT, and it still attaches and carries data.
func TestDirectIOReachesTgt(t *testing.T) {
	e := newRealEnv(t, 0)
	if e.target.Mode.Target != iscsi.ToolTgt {
		t.Skipf("bsoflags are tgtd's; this run's target is %s", e.target.Mode.Target)
	}
	ctx := backend.WithSecrets(t.Context(), chapSecrets)
	if err := e.inst.Attacher.RegisterNode(ctx, backend.NodeInfo{NodeID: "node-a"}); err != nil {
		t.Fatal(err)
	}
	img, err := e.inst.Store.Create(ctx, backend.VolumeSpec{Name: "pvc-dio", CapacityBytes: 8 << 20, AccessType: backend.AccessBlock,
		MutableParameters: map[string]string{iscsi.MutableParamDirectIO: "true"}})
	if err != nil {
		t.Fatal(err)
	}
	pc, err := e.inst.Exporter.Publish(ctx, img.ID, backend.Attachment{NodeID: "node-a", AccessMode: backend.SingleNodeWriter})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("tgtadm", "--lld", "iscsi", "--mode", "target", "--op", "show")
	cmd.Env = append(os.Environ(), "TGT_IPC_SOCKET="+e.target.Socket)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Backing store flags: direct") {
		t.Fatalf("tgtadm show (%v):\n%s\nwant the LUN opened with bsoflags direct", err, out)
	}
	dev, err := e.inst.Attacher.Attach(ctx, backend.AttachRequest{ImageID: img.ID, NodeID: "node-a", PublishContext: pc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.inst.Attacher.Detach(context.Background(), img.ID, ""); err != nil {
			t.Error(err)
		}
	})
	payload := []byte("spindle direct-io payload")
	f, err := os.OpenFile(dev.Path, os.O_WRONLY|os.O_SYNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(payload, 4096); err != nil {
		t.Fatal(err)
	}
	f.Close()
	got, err := e.readImage(ctx, img.ID, 4096, len(payload))
	if err != nil || string(got) != string(payload) {
		t.Fatalf("the image file holds %q (%v) after a write through %s; want %q", got, err, dev.Path, payload)
	}
}

// On a real kernel that has iscsi_tcp but has not loaded it (a node before
// its first login; `make vmtest` runs this first after the guest boots),
// the node's probe loads it and answers ready.
func TestKernelProbeLoadsTheModuleOnARealKernel(t *testing.T) {
	mode, err := iscsitest.ModeFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if mode.Attach != iscsi.ModeKernel {
		t.Skipf("the %s attach mode loads no kernel module (%s=kernel selects the kernel initiator)", mode.Attach, iscsitest.EnvAttach)
	}
	const present = "/sys/module/iscsi_tcp"
	if _, err := os.Stat(present); err == nil {
		t.Skipf("%s exists: the module is loaded already, so this node cannot show the probe loading it (run it first after boot)", present)
	}
	e := newRealEnv(t, 0)
	if err := e.inst.Attacher.Probe(t.Context()); err != nil {
		t.Fatalf("Probe on a node that has not loaded iscsi_tcp: %v", err)
	}
	if _, err := os.Stat(present); err != nil {
		t.Errorf("Probe answered ready, but %s is still missing: %v", present, err)
	}
}
