package iscsi

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/conformance"
	"github.com/spindle-csi/spindle/internal/backend/filestore"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// fakeTool is an in-memory target: the exports as last applied.
type fakeTool struct {
	mu      sync.Mutex
	targets map[string]Export
	resized []string
}

func newFakeTool() *fakeTool { return &fakeTool{targets: map[string]Export{}} }

func (f *fakeTool) Apply(_ context.Context, e Export) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e.CHAP.keep() {
		e.CHAP = f.targets[e.IQN].CHAP
	}
	e.Initiators = slices.Clone(e.Initiators)
	f.targets[e.IQN] = e
	return nil
}

func (f *fakeTool) Remove(_ context.Context, iqn string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.targets, iqn)
	return nil
}

func (f *fakeTool) Resize(_ context.Context, e Export) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resized = append(f.resized, e.IQN)
	return nil
}

func (f *fakeTool) Targets(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for iqn := range f.targets {
		out = append(out, iqn)
	}
	return out, nil
}

func (f *fakeTool) Probe(context.Context) error { return nil }

func (f *fakeTool) get(iqn string) (Export, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.targets[iqn]
	return e, ok
}

// fakeProber answers for image files as blockdev.Blkid.Probe does with
// blkid's answers: blank unless the test says what a file holds.
type fakeProber struct {
	mu     sync.Mutex
	holds  map[string]blockdev.Signature
	err    error
	probed []string
}

func (f *fakeProber) Probe(_ context.Context, path string) (blockdev.Signature, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.probed = append(f.probed, filepath.Base(path))
	return f.holds[path], f.err
}

func (f *fakeProber) set(path string, sig blockdev.Signature) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.holds == nil {
		f.holds = map[string]blockdev.Signature{}
	}
	f.holds[path] = sig
}

func fakeConfig(t *testing.T, maxBytes int64) Config {
	return Config{
		PoolDir: filepath.Join(t.TempDir(), "pool"), MaxProvisionedBytes: maxBytes, Portals: []string{"192.0.2.1:3260"},
		TargetPrefix: "iqn.2026-01.dev.spindle", InitiatorPrefix: "iqn.2026-01.dev.spindle.node",
	}.withDefaults()
}

func fakeInstance(t *testing.T, maxBytes int64) (*backend.Instance, *fakeTool) {
	t.Helper()
	inst, tool, _ := fakeInstanceProbed(t, maxBytes)
	return inst, tool
}

func fakeInstanceProbed(t *testing.T, maxBytes int64) (*backend.Instance, *fakeTool, *fakeProber) {
	t.Helper()
	tool, probe := newFakeTool(), &fakeProber{}
	inst, err := newInstance("fake", fakeConfig(t, maxBytes), tool, nil, probe)
	if err != nil {
		t.Fatal(err)
	}
	return inst, tool, probe
}

// poolOf is the instance's opened pool.
func poolOf(t *testing.T, inst *backend.Instance) *filestore.Store {
	t.Helper()
	fs, err := inst.Store.(*Store).Pool()
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// TestConformanceFakeTarget runs the controller side of the shared suite
// on an in-memory target, so the store and exporter are checked without
// root or tgtd; the real suite (real_test.go) covers the rest.
func TestConformanceFakeTarget(t *testing.T) {
	conformance.Run(t, func(t *testing.T, opts conformance.Options) *conformance.Fixture {
		inst, _ := fakeInstance(t, opts.CapacityBytes)
		// A node plugin in the controller's process registers with it.
		node := inst.Attacher
		inst.Attacher = nil
		return &conformance.Fixture{
			Instance:          inst,
			RegisterNode:      node.RegisterNode,
			ImageID:           filestore.ImageIDForName,
			MutableParameters: map[string]string{MutableParamDirectIO: "true"},
			Secrets:           map[string]string{SecretUser: "u", SecretPassword: "p"},
			NoAttach:          "the fake target has no initiator",
		}
	})
}

// The target follows the attachments: the ACL lists exactly the published
// nodes' initiators, CHAP comes from the publish's secrets and stays when
// a node leaves, and the last unpublish takes the target away.
func TestExportFollowsAttachments(t *testing.T) {
	inst, tool := fakeInstance(t, 0)
	fs := poolOf(t, inst)
	ctx := backend.WithSecrets(t.Context(), map[string]string{SecretUser: "u", SecretPassword: "p"})
	img, err := inst.Store.Create(ctx, backend.VolumeSpec{Name: "pvc-x", CapacityBytes: 1 << 20, AccessType: backend.AccessBlock})
	if err != nil {
		t.Fatal(err)
	}
	iqn := TargetIQN("iqn.2026-01.dev.spindle", "fake", img.ID)
	ro := backend.Attachment{AccessMode: backend.MultiNodeReaderOnly, ReadOnly: true}
	for _, n := range []string{"node-b", "node-a"} {
		a := ro
		a.NodeID = n
		pc, err := inst.Exporter.Publish(ctx, img.ID, a)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			ContextTargetIQN: iqn, ContextLUN: "1", ContextPortals: "192.0.2.1:3260", ContextSerial: Serial("fake", img.ID),
			backend.ContextReadOnly: "true", ContextInitiator: "iqn.2026-01.dev.spindle.node:" + n,
			ContextFormatted: "false", ContextAccessType: "block",
		}
		if !maps.Equal(pc, want) {
			t.Fatalf("publish_context = %v, want %v", pc, want)
		}
	}
	x, ok := tool.get(iqn)
	want := []string{"iqn.2026-01.dev.spindle.node:node-a", "iqn.2026-01.dev.spindle.node:node-b"}
	if !ok || !slices.Equal(x.Initiators, want) || x.CHAP == nil || x.CHAP.User != "u" || x.ImagePath != fs.ImagePath(img.ID) {
		t.Fatalf("export = %+v, want ACL %v with CHAP user u", x, want)
	}
	// Unpublish carries no secrets: CHAP stays on the target.
	if err := inst.Exporter.Unpublish(t.Context(), img.ID, "node-b"); err != nil {
		t.Fatal(err)
	}
	if x, _ := tool.get(iqn); !slices.Equal(x.Initiators, want[:1]) || x.CHAP == nil || x.CHAP.User != "u" {
		t.Fatalf("after node-b left: %+v", x)
	}
	// A repeated publish without the secrets may not drop CHAP.
	a := ro
	a.NodeID = "node-a"
	_, err = inst.Exporter.Publish(t.Context(), img.ID, a)
	testutil.WantKind(t, err, errdefs.ErrPrecondition, SecretUser)
	// Growing a published volume resizes its LUN.
	if _, err := inst.Store.Expand(t.Context(), img.ID, 2<<20); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tool.resized, []string{iqn}) {
		t.Fatalf("resized %v, want %s", tool.resized, iqn)
	}
	if err := inst.Exporter.Unpublish(t.Context(), img.ID, "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, ok := tool.get(iqn); ok {
		t.Fatal("the target outlived its last publish")
	}
	// Unpublished, it may be published without CHAP again.
	if _, err := inst.Exporter.Publish(t.Context(), img.ID, a); err != nil {
		t.Fatal(err)
	}
	if x, _ := tool.get(iqn); x.CHAP != nil {
		t.Fatalf("export after a publish without secrets = %+v, want no CHAP", x)
	}
}
