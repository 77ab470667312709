package iscsi

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// The controller hands the node what it knows of the image: a new mount
// volume may be formatted; once its file holds a filesystem (the node's
// mkfs, which the node cannot record anywhere) the next publish says it is
// formatted and records it; a copy is never to be formatted whatever its
// file holds; a block volume is never probed.
func TestPublishHandsTheNodeTheFormattedFact(t *testing.T) {
	inst, _, probe := fakeInstanceProbed(t, 0)
	fs := poolOf(t, inst)
	ctx := t.Context()
	mount := backend.VolumeSpec{Name: "pvc-mount", CapacityBytes: 1 << 20, AccessType: backend.AccessMount, FsType: "ext4"}
	img, err := inst.Store.Create(ctx, mount)
	if err != nil {
		t.Fatal(err)
	}
	publish := func(id, node string) map[string]string {
		t.Helper()
		pc, err := inst.Exporter.Publish(ctx, id, backend.Attachment{NodeID: node, AccessMode: backend.SingleNodeWriter})
		if err != nil {
			t.Fatalf("Publish(%s, %s): %v", id, node, err)
		}
		return pc
	}
	unpublish := func(id, node string) {
		t.Helper()
		if err := inst.Exporter.Unpublish(ctx, id, node); err != nil {
			t.Fatal(err)
		}
	}
	wantContext := func(what string, pc map[string]string, formatted, fsType, access string) {
		t.Helper()
		if pc[ContextFormatted] != formatted || pc[ContextFsType] != fsType || pc[ContextAccessType] != access {
			t.Errorf("%s: publish_context %v; want formatted=%s fsType=%q accessType=%s", what, pc, formatted, fsType, access)
		}
	}

	wantContext("a new volume", publish(img.ID, "node-a"), "false", "ext4", "mount")
	unpublish(img.ID, "node-a")

	// node-a's mkfs made xfs after all (its capability said so).
	probe.set(fs.ImagePath(img.ID), blockdev.Signature{Type: "xfs", Usage: "filesystem"})
	wantContext("the volume after a node formatted it", publish(img.ID, "node-b"), "true", "xfs", "mount")
	if got, _ := inst.Store.Get(ctx, img.ID); !got.Formatted || got.FsType != "xfs" {
		t.Fatalf("the record after the publish: Formatted %t FsType %q, want formatted xfs", got.Formatted, got.FsType)
	}
	// Recorded: no more probing, whatever the file holds now.
	probe.set(fs.ImagePath(img.ID), blockdev.Signature{})
	probe.probed = nil
	wantContext("a repeated publish", publish(img.ID, "node-b"), "true", "xfs", "mount")
	if len(probe.probed) != 0 {
		t.Errorf("a formatted volume's image was probed again: %v", probe.probed)
	}
	unpublish(img.ID, "node-b")

	// A clone whose file reads blank is still never formatted.
	clone := mount
	clone.Name, clone.FsType, clone.Source = "pvc-clone", "", &backend.ContentSource{ImageID: img.ID}
	copied, err := inst.Store.Create(ctx, clone)
	if err != nil {
		t.Fatal(err)
	}
	probe.set(fs.ImagePath(copied.ID), blockdev.Signature{})
	wantContext("a clone", publish(copied.ID, "node-a"), "true", "xfs", "mount")

	// Anything but a filesystem counts as formatted, keeping the fs type.
	other := mount
	other.Name = "pvc-parted"
	parted, err := inst.Store.Create(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	probe.set(fs.ImagePath(parted.ID), blockdev.Signature{PTType: "gpt"})
	wantContext("a volume holding a partition table", publish(parted.ID, "node-a"), "true", "ext4", "mount")

	block, err := inst.Store.Create(ctx, backend.VolumeSpec{Name: "pvc-block", CapacityBytes: 1 << 20, AccessType: backend.AccessBlock})
	if err != nil {
		t.Fatal(err)
	}
	probe.probed = nil
	probe.set(fs.ImagePath(block.ID), blockdev.Signature{Type: "ext4", Usage: "filesystem"})
	wantContext("a block volume", publish(block.ID, "node-a"), "false", "", "block")
	if len(probe.probed) != 0 {
		t.Errorf("a block volume's image was probed: %v", probe.probed)
	}
}

// A publish whose probe fails grants nothing: the node would otherwise be
// told it may format a volume the controller could not look at.
func TestPublishRefusedWhenTheImageCannotBeProbed(t *testing.T) {
	inst, tool, probe := fakeInstanceProbed(t, 0)
	ctx := t.Context()
	img, err := inst.Store.Create(ctx, backend.VolumeSpec{Name: "pvc-x", CapacityBytes: 1 << 20, AccessType: backend.AccessMount, FsType: "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	// What blockdev.Blkid.Probe answers for a file blkid could not open.
	probe.err = errors.New("cannot tell what /pool/x.img holds: exit status 2: blkid: error: /pool/x.img: Permission denied")
	_, err = inst.Exporter.Publish(ctx, img.ID, backend.Attachment{NodeID: "node-a", AccessMode: backend.SingleNodeWriter})
	testutil.WantKind(t, err, errdefs.ErrUnavailable, img.ID, "Permission denied")
	if got, _ := inst.Store.Get(ctx, img.ID); len(got.Attachments) != 0 || got.Formatted {
		t.Fatalf("a refused publish left %+v", got)
	}
	if _, ok := tool.get(TargetIQN("iqn.2026-01.dev.spindle", "fake", img.ID)); ok {
		t.Fatal("a refused publish made a target")
	}
	// An image file that is gone is not blank.
	probe.err = nil
	fs := poolOf(t, inst)
	if err := os.Remove(fs.ImagePath(img.ID)); err != nil {
		t.Fatal(err)
	}
	_, err = inst.Exporter.Publish(ctx, img.ID, backend.Attachment{NodeID: "node-a", AccessMode: backend.SingleNodeWriter})
	testutil.WantKind(t, err, errdefs.ErrNotFound, img.ID)
}

// What the node takes from the publish_context, and what it refuses.
func TestNodeGrantFromThePublishContext(t *testing.T) {
	src := source{naming: naming{cfg: fakeConfig(t, 0), instance: "fake"}, nodes: &nodeRegistry{}}
	full := func(change func(map[string]string)) map[string]string {
		pc := map[string]string{
			ContextTargetIQN: TargetIQN("iqn.2026-01.dev.spindle", "fake", "pvc-x"), ContextLUN: "1",
			ContextPortals: "192.0.2.1:3260", ContextSerial: Serial("fake", "pvc-x"), backend.ContextReadOnly: "false",
			ContextInitiator: "iqn.2026-01.dev.spindle.node:node-a", ContextFormatted: "false",
			ContextFsType: "ext4", ContextAccessType: "mount",
		}
		change(pc)
		return pc
	}
	tests := []struct {
		name     string
		pc       map[string]string
		want     backend.Image
		readOnly bool
		kind     error
		mentions []string
	}{
		{"new volume", full(func(map[string]string) {}), backend.Image{ID: "pvc-x", FsType: "ext4", AccessType: backend.AccessMount}, false, nil, nil},
		{"formatted, read-only", full(func(pc map[string]string) { pc[ContextFormatted], pc[backend.ContextReadOnly] = "true", "true" }),
			backend.Image{ID: "pvc-x", Formatted: true, FsType: "ext4", AccessType: backend.AccessMount}, true, nil, nil},
		{"an older controller's context: never format", full(func(pc map[string]string) {
			delete(pc, ContextFormatted)
			delete(pc, ContextFsType)
			delete(pc, ContextAccessType)
			delete(pc, ContextInitiator)
		}), backend.Image{ID: "pvc-x", Formatted: true}, false, nil, nil},
		{"not published", map[string]string{backend.ContextReadOnly: "false"}, backend.Image{}, false, errdefs.ErrPrecondition, []string{"pvc-x", `"node-a"`, "not published"}},
		{"published to another node", full(func(pc map[string]string) { pc[ContextInitiator] = "iqn.2026-01.dev.spindle.node:node-b" }),
			backend.Image{}, false, errdefs.ErrPrecondition, []string{"node-b", `"node-a"`}},
		{"malformed formatted", full(func(pc map[string]string) { pc[ContextFormatted] = "yes" }), backend.Image{}, false, errdefs.ErrInvalidArgument, []string{ContextFormatted, "yes"}},
		{"malformed read-only", full(func(pc map[string]string) { pc[backend.ContextReadOnly] = "" }), backend.Image{}, false, errdefs.ErrInvalidArgument, []string{backend.ContextReadOnly}},
		{"unknown access type", full(func(pc map[string]string) { pc[ContextAccessType] = "file" }), backend.Image{}, false, errdefs.ErrInvalidArgument, []string{ContextAccessType, "file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img, grant, err := src.Grant(t.Context(), backend.AttachRequest{ImageID: "pvc-x", NodeID: "node-a", PublishContext: tt.pc})
			if tt.kind != nil {
				testutil.WantKind(t, err, tt.kind, tt.mentions...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if img.ID != tt.want.ID || img.Formatted != tt.want.Formatted || img.FsType != tt.want.FsType || img.AccessType != tt.want.AccessType ||
				grant.NodeID != "node-a" || grant.ReadOnly != tt.readOnly {
				t.Fatalf("Grant = %+v, %+v; want %+v, read-only %t", img, grant, tt.want, tt.readOnly)
			}
		})
	}
}

// Without a node plugin in its process a controller accepts any node; with
// one, that node only.
func TestNodeRegistry(t *testing.T) {
	r := &nodeRegistry{}
	if info, err := r.lookup("node-x", "iscsi/fake"); err != nil || info.NodeID != "node-x" || info.MaxVolumesPerNode != 0 {
		t.Fatalf("lookup in an empty registry = %+v, %v; want node-x without a limit", info, err)
	}
	r.register(backend.NodeInfo{NodeID: "node-a", MaxVolumesPerNode: 3})
	if info, err := r.lookup("node-a", "iscsi/fake"); err != nil || info.MaxVolumesPerNode != 3 {
		t.Fatalf("lookup of the registered node = %+v, %v", info, err)
	}
	_, err := r.lookup("node-x", "iscsi/fake")
	testutil.WantKind(t, err, errdefs.ErrNotFound, "node-x", "node-a")
}

// A node plugin's instance, configured with a pool directory that does not
// exist, attaches, refreshes and detaches a volume from its publish_context
// alone (the kernel initiator, scripted), and never creates the directory.
func TestNodeInstanceNeedsNoPool(t *testing.T) {
	n := newFakeNode(t, true)
	cfg := fakeConfig(t, 0)
	cfg.PoolDir = filepath.Join(t.TempDir(), "not-here")
	cfg.StateDir = n.state
	const id = "pvc-n"
	iqn, serial := TargetIQN(cfg.TargetPrefix, "test", id), Serial("test", id)
	init := cfg.InitiatorPrefix + ":node-a"
	portal := kPortal
	cfg.Portals = []string{portal}
	adm := func(args ...string) *commandtest.Step {
		return iscsiadm(append([]string{"-m", "node", "-T", iqn, "-p", portal, "-I", "spindle"}, args...)...)
	}
	k := n.kernel(t,
		iscsiadm("-m", "iface", "-I", "spindle", "-o", "show").Prints("iface.initiatorname = "+init+"\n"),
		iscsiadm("-m", "discovery", "-t", "sendtargets", "-p", portal, "-I", "spindle").Prints(portal+",1 "+iqn+"\n"),
		adm("-o", "update", "-n", "node.session.auth.authmethod", "-v", "None"),
		adm("--login").Does(func() { n.disk(t, "sdd", iqn, 1, serial) }),
		adm("--rescan").Prints("Rescanning session [sid: 1, target: "+iqn+", portal: 127.0.0.1,3260]\n"),
		adm("--logout").Prints("Logout of [sid: 1, target: "+iqn+", portal: 127.0.0.1,3260] successful.\n"),
		adm("-o", "delete"),
	)
	inst, err := newInstance("test", cfg, newFakeTool(), k, &fakeProber{})
	if err != nil {
		t.Fatal(err)
	}
	a := inst.Attacher
	ctx := t.Context()
	if err := a.RegisterNode(ctx, backend.NodeInfo{NodeID: "node-a"}); err != nil {
		t.Fatal(err)
	}
	if err := a.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	pc := map[string]string{
		ContextTargetIQN: iqn, ContextLUN: "1", ContextPortals: portal, ContextSerial: serial, backend.ContextReadOnly: "false",
		ContextInitiator: init, ContextFormatted: "false", ContextFsType: "ext4", ContextAccessType: "mount",
	}
	dev, err := a.Attach(ctx, backend.AttachRequest{ImageID: id, NodeID: "node-a", PublishContext: pc})
	if err != nil {
		t.Fatal(err)
	}
	want := backend.Device{Path: n.dev + "/sdd", FsType: "ext4", AccessType: backend.AccessMount}
	if *dev != want {
		t.Fatalf("Attach = %+v, want %+v", dev, want)
	}
	if err := a.RecordFormatted(ctx, id, "ext4"); err != nil {
		t.Fatal(err)
	}
	if size, err := a.Refresh(ctx, id, dev.Path); err != nil || size != 16384*512 {
		t.Fatalf("Refresh = %d, %v; want %d", size, err, 16384*512)
	}
	if err := a.Detach(ctx, id, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(cfg.PoolDir); !os.IsNotExist(err) {
		t.Fatalf("the node created its configured pool directory %s (%v)", cfg.PoolDir, err)
	}
	if entries, _ := os.ReadDir(n.state); !slices.ContainsFunc(entries, func(e os.DirEntry) bool { return e.Name() == "sessions.json" }) {
		t.Fatalf("the node's state directory holds %v, want its session counts", entries)
	}
}
