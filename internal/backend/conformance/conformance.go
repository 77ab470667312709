// Package conformance is the test suite every Spindle backend passes, so that
// internal/driver can rely on the contracts of internal/backend without
// knowing which backend it talks to. It is modelled on containerd's
// snapshotter suite: a backend's own test calls
//
//	conformance.Run(t, func(t *testing.T, opts conformance.Options) *conformance.Fixture {
//		... build a fresh instance, register its cleanups with t.Cleanup ...
//	})
//
// and the suite runs every case as a subtest; each case builds its own
// fixture (the subtests of a table share their case's).
//
// The suite speaks only through backend.Instance and the hooks of Fixture: no
// file paths, no device names it did not get from the backend, so the loop,
// iSCSI and RBD backends all run the same cases.
package conformance

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/testutil"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Node IDs the suite uses. NodeA, NodeB and NodeC are registered through
// Fixture.RegisterNode in every fixture; NodeUnregistered never is.
// Attach runs as NodeA only: a backend whose attacher can act for one node
// (an iSCSI initiator name, a cephx client) must make NodeA this host.
const (
	NodeA            = "node-a"
	NodeB            = "node-b"
	NodeC            = "node-c"
	NodeUnregistered = "node-never-registered"
)

// Sizes the suite asks for. They are whole MiB so that backends which round
// to a unit (RBD objects, LUN blocks) can return exactly what was asked.
const (
	MiB = int64(1) << 20
	// VolumeBytes is the size of an ordinary test volume.
	VolumeBytes = 4 * MiB
	// SmallCapacityBytes is the capacity the exhaustion case asks for.
	SmallCapacityBytes = 16 * MiB
)

// Options says what kind of instance a case needs.
type Options struct {
	// CapacityBytes, when positive, asks for an instance that cannot hold
	// images totalling much more than this many bytes (a small pool
	// filesystem, a provisioning cap, a quota). It must still hold one
	// VolumeBytes image. A factory that cannot build such an instance calls
	// t.Skip naming why.
	CapacityBytes int64
}

// Fixture is one fresh backend instance plus the hooks the suite needs.
type Fixture struct {
	// Instance is a fresh instance holding no images. Store and Exporter are
	// required; Attacher is required unless NoAttach is set (RecordFormatted
	// and the attach cases use it).
	Instance *backend.Instance

	// RegisterNode makes info.NodeID known to the backend the way a node
	// plugin on that node would, with its MaxVolumesPerNode, so Publish to
	// it can succeed. Nil means Instance.Attacher.RegisterNode(ctx, info).
	RegisterNode func(ctx context.Context, info backend.NodeInfo) error

	// ImageID returns the image ID Create would give the CSI name, for a
	// backend that derives it deterministically (nil when it does not). The
	// exhaustion case uses it to check that a failed Create left no image
	// that Get could find.
	ImageID func(name string) string

	// Artifacts lists, in any order, everything the backend holds for this
	// instance (files, LUNs, RBD images, metadata objects, temporaries), so
	// the suite can check that a failed Create leaves nothing behind. Nil
	// skips that check.
	Artifacts func(ctx context.Context) ([]string, error)

	// ExtraParameter is one StorageClass parameter the backend takes
	// besides mkfsOptions (one key), for the check that a repeated Create
	// with it added is ALREADY_EXISTS. Nil: {"mountOptions": "noatime"},
	// for stores that keep any key they are given; a store that validates
	// its keys (rbd) would refuse that one as unknown first.
	ExtraParameter map[string]string

	// MutableParameters are mutable parameters the backend accepts
	// (ImageStore.Modify, VolumeSpec.MutableParameters). Nil skips the
	// checks that need a valid set; unknown keys are checked either way.
	MutableParameters map[string]string

	// WriteImage and ReadImage reach the content of the image with the
	// given ID, at a byte offset, so the suite can check what clones and
	// snapshots hold. Nil skips the content checks.
	WriteImage func(ctx context.Context, imageID string, off int64, data []byte) error
	ReadImage  func(ctx context.Context, imageID string, off int64, n int) ([]byte, error)

	// Secrets are the CSI secrets every call carries (CHAP credentials,
	// cephx keys), as the driver passes them: in the context.
	Secrets map[string]string

	// NoNodeRegistry, when not empty, says why the backend keeps no
	// registry of nodes and accepts any valid node ID at Publish (the
	// node's identity travels in the node ID itself); the
	// unregistered-node case is then skipped with that reason.
	NoNodeRegistry string

	// NodeWithoutStore, when not empty, says why the backend's node side
	// reads no image store: its Attacher knows only what the
	// publish_context and the secrets carry (iSCSI: a node has the
	// target's portal, the publish_context and the CHAP secret). Its
	// RecordFormatted records nothing: the filesystem the node made is the
	// record, which the controller reads from the image at the volume's
	// next publish and hands to the node in the publish_context. Format is
	// then required. Such a node cannot tell a deleted image from one never
	// published to it: an attach of either is refused, ErrNotFound or
	// ErrPrecondition.
	NodeWithoutStore string
	// Format writes a filesystem of fsType into the image, as a node's
	// mkfs on its device does (for NodeWithoutStore).
	Format func(ctx context.Context, imageID, fsType string) error

	// NoAttach, when not empty, says why the node side cannot run here
	// (not root, no /dev/loop-control, no initiator); the attach cases
	// are then skipped with that reason.
	NoAttach string
}

// Factory builds a fresh fixture for one case. It registers its own
// cleanups with t.Cleanup; they run after the suite's (which detach what the
// case attached), so a factory may remove whatever the instance still holds.
type Factory func(t *testing.T, opts Options) *Fixture

// Run runs the whole suite against the backend newFixture builds.
func Run(t *testing.T, newFixture Factory) {
	t.Run("Probe", func(t *testing.T) { testProbe(t, newFixture) })
	t.Run("SupportsAccess", func(t *testing.T) { testSupportsAccess(t, newFixture) })
	t.Run("Create", func(t *testing.T) { testCreate(t, newFixture) })
	t.Run("CreateRepeat", func(t *testing.T) { testCreateRepeat(t, newFixture) })
	t.Run("CreateInvalidCapacity", func(t *testing.T) { testCreateInvalidCapacity(t, newFixture) })
	t.Run("GetUnknown", func(t *testing.T) { testGetUnknown(t, newFixture) })
	t.Run("Publish", func(t *testing.T) { testPublish(t, newFixture) })
	t.Run("Delete", func(t *testing.T) { testDelete(t, newFixture) })
	t.Run("Exhaustion", func(t *testing.T) { testExhaustion(t, newFixture) })
	t.Run("Attach", func(t *testing.T) { testAttach(t, newFixture) })
	t.Run("Concurrency", func(t *testing.T) { testConcurrency(t, newFixture) })
	t.Run("List", func(t *testing.T) { testList(t, newFixture) })
	t.Run("Expand", func(t *testing.T) { testExpand(t, newFixture) })
	t.Run("Modify", func(t *testing.T) { testModify(t, newFixture) })
	t.Run("Encryption", func(t *testing.T) { testEncryption(t, newFixture) })
	t.Run("Capacity", func(t *testing.T) { testCapacity(t, newFixture) })
	t.Run("Snapshots", func(t *testing.T) { testSnapshots(t, newFixture) })
	t.Run("Clone", func(t *testing.T) { testClone(t, newFixture) })
	t.Run("AttachLimit", func(t *testing.T) { testAttachLimit(t, newFixture) })
	t.Run("Refresh", func(t *testing.T) { testRefresh(t, newFixture) })
}

// harness is one case's fixture with the helpers every case uses.
type harness struct {
	t   *testing.T
	f   *Fixture
	ctx context.Context
}

func newHarness(t *testing.T, newFixture Factory, opts Options) *harness {
	t.Helper()
	f := newFixture(t, opts)
	if f == nil || f.Instance == nil || f.Instance.Store == nil || f.Instance.Exporter == nil {
		t.Fatal("the factory returned a fixture without an instance, store or exporter")
	}
	if f.NoAttach == "" && f.Instance.Attacher == nil {
		t.Fatal("the fixture offers attach but its instance has no Attacher")
	}
	if f.NodeWithoutStore != "" && f.Format == nil {
		t.Fatal("the fixture's node reads no store (NodeWithoutStore) but it has no Format")
	}
	h := &harness{t: t, f: f, ctx: backend.WithSecrets(t.Context(), f.Secrets)}
	for _, n := range []string{NodeA, NodeB, NodeC} {
		if err := h.registerNode(backend.NodeInfo{NodeID: n}); err != nil {
			t.Fatalf("register node %s: %v", n, err)
		}
	}
	return h
}

// sub is h for a subtest that shares the case's fixture, so that helpers
// fail (and register cleanups on) the subtest.
func (h *harness) sub(t *testing.T) *harness {
	c := *h
	c.t = t
	return &c
}

func (h *harness) registerNode(info backend.NodeInfo) error {
	if h.f.RegisterNode != nil {
		return h.f.RegisterNode(h.ctx, info)
	}
	if h.f.Instance.Attacher == nil {
		return fmt.Errorf("the fixture has neither RegisterNode nor an Attacher")
	}
	return h.f.Instance.Attacher.RegisterNode(h.ctx, info)
}

func (h *harness) store() backend.ImageStore  { return h.f.Instance.Store }
func (h *harness) exporter() backend.Exporter { return h.f.Instance.Exporter }
func (h *harness) attacher() backend.Attacher { return h.f.Instance.Attacher }

// needAttach skips the case when the fixture cannot attach here.
func (h *harness) needAttach() {
	h.t.Helper()
	if h.f.NoAttach != "" {
		h.t.Skipf("attach cases skipped: %s", h.f.NoAttach)
	}
}

// needMode skips the case when the backend does not serve mode; the suite
// only checks behaviour the backend claims.
func (h *harness) needMode(m backend.AccessMode) {
	h.t.Helper()
	if err := h.exporter().SupportsAccess(backend.AccessMount, m); err != nil {
		h.t.Skipf("the backend does not support %s: %v", m, err)
	}
}

func (h *harness) create(spec backend.VolumeSpec) *backend.Image {
	h.t.Helper()
	img, err := h.store().Create(h.ctx, spec)
	if err != nil {
		h.t.Fatalf("Create(%q): %v", spec.Name, err)
	}
	if img == nil || img.ID == "" {
		h.t.Fatalf("Create(%q) returned no image ID: %+v", spec.Name, img)
	}
	return img
}

func (h *harness) get(id string) *backend.Image {
	h.t.Helper()
	img, err := h.store().Get(h.ctx, id)
	if err != nil {
		h.t.Fatalf("Get(%s): %v", id, err)
	}
	return img
}

func (h *harness) publish(id string, att backend.Attachment) map[string]string {
	h.t.Helper()
	pc, err := h.exporter().Publish(h.ctx, id, att)
	if err != nil {
		h.t.Fatalf("Publish(%s, %s): %v", id, att.NodeID, err)
	}
	return pc
}

func (h *harness) unpublish(id, nodeID string) {
	h.t.Helper()
	if err := h.exporter().Unpublish(h.ctx, id, nodeID); err != nil {
		h.t.Fatalf("Unpublish(%s, %s): %v", id, nodeID, err)
	}
}

func (h *harness) delete(id string) {
	h.t.Helper()
	if err := h.store().Delete(h.ctx, id); err != nil {
		h.t.Fatalf("Delete(%s): %v", id, err)
	}
}

// attach attaches as req asks and detaches the image again when the case
// ends, before the factory's own cleanups run.
func (h *harness) attach(req backend.AttachRequest) *backend.Device {
	h.t.Helper()
	dev, err := h.attacher().Attach(h.ctx, req)
	if err != nil {
		h.t.Fatalf("Attach(%s on %s, read-only=%t): %v", req.ImageID, req.NodeID, req.ReadOnly, err)
	}
	if dev == nil || dev.Path == "" {
		h.t.Fatalf("Attach(%s) returned no device path: %+v", req.ImageID, dev)
	}
	h.t.Cleanup(func() {
		// t.Context is already cancelled when cleanups run.
		if err := h.attacher().Detach(backend.WithSecrets(context.Background(), h.f.Secrets), req.ImageID, ""); err != nil {
			h.t.Errorf("cleanup: Detach(%s): %v", req.ImageID, err)
		}
	})
	return dev
}

func (h *harness) devices(id string) []backend.Device {
	h.t.Helper()
	devs, err := h.attacher().Devices(h.ctx, id)
	if err != nil {
		h.t.Fatalf("Devices(%s): %v", id, err)
	}
	return devs
}

func (h *harness) artifacts() []string {
	h.t.Helper()
	if h.f.Artifacts == nil {
		return nil
	}
	a, err := h.f.Artifacts(h.ctx)
	if err != nil {
		h.t.Fatalf("Artifacts: %v", err)
	}
	slices.Sort(a)
	return a
}

// missingID returns the ID of an image that existed and was deleted: a
// well-formed ID for any backend that is certain not to exist.
func (h *harness) missingID() string {
	h.t.Helper()
	img := h.create(mountSpec("pvc-conformance-gone"))
	h.delete(img.ID)
	return img.ID
}

func mountSpec(name string) backend.VolumeSpec {
	return backend.VolumeSpec{
		Name:          name,
		CapacityBytes: VolumeBytes,
		AccessType:    backend.AccessMount,
		FsType:        "ext4",
		Parameters:    map[string]string{"mkfsOptions": "-m 0"},
	}
}

func blockSpec(name string) backend.VolumeSpec {
	return backend.VolumeSpec{Name: name, CapacityBytes: VolumeBytes, AccessType: backend.AccessBlock}
}

// att builds an attachment. Since differs from call to call on purpose: the
// driver stamps every publish with the current time, and a repeat must still
// be recognised as the same publish.
func att(node string, m backend.AccessMode, ro bool) backend.Attachment {
	return backend.Attachment{NodeID: node, AccessMode: m, ReadOnly: ro, Since: time.Unix(1_700_000_000+attSeq.Add(1), 0).UTC()}
}

var attSeq atomic.Int64

// checkImage compares what the store reports with what was asked for.
func checkImage(t *testing.T, what string, img *backend.Image, spec backend.VolumeSpec) {
	t.Helper()
	if img.Name != spec.Name {
		t.Errorf("%s: Name = %q, want %q", what, img.Name, spec.Name)
	}
	if img.CapacityBytes != spec.CapacityBytes {
		t.Errorf("%s: CapacityBytes = %d, want %d", what, img.CapacityBytes, spec.CapacityBytes)
	}
	if img.AccessType != spec.AccessType {
		t.Errorf("%s: AccessType = %q, want %q", what, img.AccessType, spec.AccessType)
	}
	if img.FsType != spec.FsType {
		t.Errorf("%s: FsType = %q, want %q", what, img.FsType, spec.FsType)
	}
	if !maps.Equal(img.Parameters, spec.Parameters) {
		t.Errorf("%s: Parameters = %v, want %v", what, img.Parameters, spec.Parameters)
	}
	if img.Formatted {
		t.Errorf("%s: a new image reports Formatted", what)
	}
	if len(img.Attachments) != 0 {
		t.Errorf("%s: a new image has attachments %v", what, img.Attachments)
	}
}

// nodesOf lists the attached node IDs, sorted.
func nodesOf(img *backend.Image) []string {
	var out []string
	for _, a := range img.Attachments {
		out = append(out, a.NodeID)
	}
	slices.Sort(out)
	return out
}

func testProbe(t *testing.T, newFixture Factory) {
	h := newHarness(t, newFixture, Options{})
	if err := h.store().Probe(h.ctx); err != nil {
		t.Fatalf("Store.Probe on a fresh instance: %v", err)
	}
	if h.f.NoAttach == "" {
		if err := h.attacher().Probe(h.ctx); err != nil {
			t.Fatalf("Attacher.Probe where the fixture says attach works: %v", err)
		}
	}
}

func testSupportsAccess(t *testing.T, newFixture Factory) {
	h := newHarness(t, newFixture, Options{})
	all := []backend.AccessMode{
		backend.SingleNodeWriter, backend.SingleNodeReaderOnly, backend.SingleNodeSingleWriter,
		backend.SingleNodeMultiWriter, backend.MultiNodeReaderOnly, backend.MultiNodeSingleWriter,
		backend.MultiNodeMultiWriter,
	}
	// Every backend serves these; the rest of the suite relies on them.
	required := []backend.AccessMode{backend.SingleNodeWriter, backend.MultiNodeReaderOnly}
	for _, at := range []backend.AccessType{backend.AccessMount, backend.AccessBlock} {
		for _, m := range all {
			t.Run(string(at)+"/"+string(m), func(t *testing.T) {
				err := h.exporter().SupportsAccess(at, m)
				if err == nil {
					return
				}
				if slices.Contains(required, m) {
					t.Fatalf("SupportsAccess(%s, %s) = %v; every backend must serve it", at, m, err)
				}
				// A refusal must be an invalid argument that says which mode.
				testutil.WantKind(t, err, errdefs.ErrInvalidArgument, string(m))
			})
		}
	}
	t.Run("unknown access type", func(t *testing.T) {
		testutil.WantKind(t, h.exporter().SupportsAccess("floppy", backend.SingleNodeWriter), errdefs.ErrInvalidArgument, "floppy")
	})
	t.Run("unknown access mode", func(t *testing.T) {
		testutil.WantKind(t, h.exporter().SupportsAccess(backend.AccessMount, "SOMETIMES"), errdefs.ErrInvalidArgument, "SOMETIMES")
	})
}

func testCreate(t *testing.T, newFixture Factory) {
	h := newHarness(t, newFixture, Options{})
	xfs := mountSpec("pvc-conformance-xfs")
	xfs.FsType, xfs.Parameters = "xfs", nil
	big := blockSpec("pvc-conformance-block-big")
	big.CapacityBytes = 2 * VolumeBytes
	tests := []struct {
		name string
		spec backend.VolumeSpec
	}{
		{"mount ext4 with parameters", mountSpec("pvc-conformance-ext4")},
		{"mount xfs without parameters", xfs},
		{"block", blockSpec("pvc-conformance-block")},
		{"block of another size", big},
		{"name that is not a pvc name", mountSpec("Some Volume/with:odd*chars")},
	}
	ids := map[string]string{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := h.sub(t)
			img := h.create(tt.spec)
			checkImage(t, "Create", img, tt.spec)
			got := h.get(img.ID)
			if got.ID != img.ID {
				t.Errorf("Get(%s).ID = %q", img.ID, got.ID)
			}
			checkImage(t, "Get after Create", got, tt.spec)
			if other, dup := ids[img.ID]; dup {
				t.Errorf("volumes %q and %q got the same image ID %s", other, tt.spec.Name, img.ID)
			}
			ids[img.ID] = tt.spec.Name
		})
	}
}

func testCreateRepeat(t *testing.T, newFixture Factory) {
	h := newHarness(t, newFixture, Options{})
	extra := h.f.ExtraParameter
	if len(extra) == 0 {
		extra = map[string]string{"mountOptions": "noatime"}
	}
	tests := []struct {
		name   string
		change func(*backend.VolumeSpec)
		want   error // nil: compatible, the same image comes back
	}{
		{"identical", func(*backend.VolumeSpec) {}, nil},
		{"equal parameters in another map", func(s *backend.VolumeSpec) { s.Parameters = map[string]string{"mkfsOptions": "-m 0"} }, nil},
		{"range around the existing size", func(s *backend.VolumeSpec) {
			s.RequiredBytes, s.CapacityBytes, s.LimitBytes = VolumeBytes/2, 2*VolumeBytes, 2*VolumeBytes
		}, nil},
		{"range exactly the existing size", func(s *backend.VolumeSpec) { s.RequiredBytes, s.LimitBytes = VolumeBytes, VolumeBytes }, nil},
		{"required below the existing size, no limit", func(s *backend.VolumeSpec) { s.RequiredBytes, s.CapacityBytes = VolumeBytes/2, VolumeBytes/2 }, nil},
		{"limit above the existing size, no required", func(s *backend.VolumeSpec) { s.LimitBytes, s.CapacityBytes = 2*VolumeBytes, 2*VolumeBytes }, nil},
		{"other size without a range", func(s *backend.VolumeSpec) { s.CapacityBytes = 2 * VolumeBytes }, errdefs.ErrAlreadyExists},
		{"required above the existing size", func(s *backend.VolumeSpec) { s.RequiredBytes, s.CapacityBytes = 2*VolumeBytes, 2*VolumeBytes }, errdefs.ErrAlreadyExists},
		{"limit below the existing size", func(s *backend.VolumeSpec) { s.LimitBytes, s.CapacityBytes = VolumeBytes/2, VolumeBytes/2 }, errdefs.ErrAlreadyExists},
		{"other fs type", func(s *backend.VolumeSpec) { s.FsType = "xfs" }, errdefs.ErrAlreadyExists},
		{"other access type", func(s *backend.VolumeSpec) { s.AccessType, s.FsType = backend.AccessBlock, "" }, errdefs.ErrAlreadyExists},
		{"other parameter value", func(s *backend.VolumeSpec) { s.Parameters = map[string]string{"mkfsOptions": "-m 5"} }, errdefs.ErrAlreadyExists},
		{"extra parameter", func(s *backend.VolumeSpec) { maps.Copy(s.Parameters, extra) }, errdefs.ErrAlreadyExists},
		{"no parameters", func(s *backend.VolumeSpec) { s.Parameters = nil }, errdefs.ErrAlreadyExists},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := h.sub(t)
			orig := mountSpec(fmt.Sprintf("pvc-conformance-repeat-%d", i))
			first := h.create(orig)
			again := mountSpec(orig.Name)
			tt.change(&again)
			img, err := h.store().Create(h.ctx, again)
			if tt.want != nil {
				testutil.WantKind(t, err, tt.want, orig.Name)
			} else {
				if err != nil {
					t.Fatalf("repeated Create: %v", err)
				}
				if img.ID != first.ID {
					t.Fatalf("repeated Create returned image %s, the first %s", img.ID, first.ID)
				}
				// The existing image is returned as it is, not resized to the new request.
				checkImage(t, "repeated Create", img, orig)
			}
			// Either way the existing image is untouched.
			checkImage(t, "Get after the repeat", h.get(first.ID), orig)
		})
	}
}

func testCreateInvalidCapacity(t *testing.T, newFixture Factory) {
	h := newHarness(t, newFixture, Options{})
	for _, size := range []int64{0, -MiB} {
		t.Run(strconv.FormatInt(size, 10), func(t *testing.T) {
			h := h.sub(t)
			spec := mountSpec("pvc-conformance-size" + strconv.FormatInt(size, 10))
			spec.CapacityBytes = size
			_, err := h.store().Create(h.ctx, spec)
			testutil.WantKind(t, err, errdefs.ErrInvalidArgument)
		})
	}
}

func testGetUnknown(t *testing.T, newFixture Factory) {
	h := newHarness(t, newFixture, Options{})
	id := h.missingID()
	_, err := h.store().Get(h.ctx, id)
	testutil.WantKind(t, err, errdefs.ErrNotFound, id)
}

func testPublish(t *testing.T, newFixture Factory) {
	t.Run("context and repeat", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		img := h.create(mountSpec("pvc-conformance-pub"))
		pc := h.publish(img.ID, att(NodeA, backend.SingleNodeWriter, false))
		if got, ok := pc[backend.ContextReadOnly]; !ok || got != "false" {
			t.Fatalf("publish_context[%q] = %q (present %t), want \"false\"; context %v", backend.ContextReadOnly, got, ok, pc)
		}
		again := h.publish(img.ID, att(NodeA, backend.SingleNodeWriter, false))
		if !maps.Equal(pc, again) {
			t.Fatalf("a repeated publish returned %v, the first %v", again, pc)
		}
		got := h.get(img.ID)
		if len(got.Attachments) != 1 {
			t.Fatalf("after a publish and its repeat, attachments = %v; want one", got.Attachments)
		}
		if a := got.Attachments[0]; a.NodeID != NodeA || a.AccessMode != backend.SingleNodeWriter || a.ReadOnly {
			t.Fatalf("attachment = %+v, want %s %s read-write", a, NodeA, backend.SingleNodeWriter)
		}
	})

	t.Run("read-only context", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		img := h.create(mountSpec("pvc-conformance-pub-ro"))
		pc := h.publish(img.ID, att(NodeA, backend.SingleNodeWriter, true))
		if pc[backend.ContextReadOnly] != "true" {
			t.Fatalf("publish_context[%q] = %q for a read-only publish; context %v", backend.ContextReadOnly, pc[backend.ContextReadOnly], pc)
		}
		if a := h.get(img.ID).Attachments; len(a) != 1 || !a[0].ReadOnly {
			t.Fatalf("attachments = %+v, want one read-only", a)
		}
	})

	singleNode := []struct {
		mode backend.AccessMode
		ro   bool
	}{
		{backend.SingleNodeWriter, false},
		{backend.SingleNodeReaderOnly, true},
		{backend.SingleNodeSingleWriter, false},
		{backend.SingleNodeMultiWriter, false},
	}
	for _, sn := range singleNode {
		t.Run("second node refused/"+string(sn.mode), func(t *testing.T) {
			h := newHarness(t, newFixture, Options{})
			h.needMode(sn.mode)
			img := h.create(mountSpec("pvc-conformance-sn"))
			h.publish(img.ID, att(NodeA, sn.mode, sn.ro))
			_, err := h.exporter().Publish(h.ctx, img.ID, att(NodeB, sn.mode, sn.ro))
			testutil.WantKind(t, err, errdefs.ErrPrecondition, NodeA)
			if got := nodesOf(h.get(img.ID)); !slices.Equal(got, []string{NodeA}) {
				t.Fatalf("attached nodes after the refusal = %v, want only %s", got, NodeA)
			}
			// Once node A lets go, node B gets it.
			h.unpublish(img.ID, NodeA)
			h.publish(img.ID, att(NodeB, sn.mode, sn.ro))
			if got := nodesOf(h.get(img.ID)); !slices.Equal(got, []string{NodeB}) {
				t.Fatalf("attached nodes = %v, want only %s", got, NodeB)
			}
		})
	}

	t.Run("same node other read-only flag", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		img := h.create(mountSpec("pvc-conformance-flags"))
		h.publish(img.ID, att(NodeA, backend.SingleNodeWriter, false))
		_, err := h.exporter().Publish(h.ctx, img.ID, att(NodeA, backend.SingleNodeWriter, true))
		testutil.WantKind(t, err, errdefs.ErrAlreadyExists, NodeA)
		if a := h.get(img.ID).Attachments; len(a) != 1 || a[0].ReadOnly {
			t.Fatalf("attachments after the refusal = %+v, want the read-write one only", a)
		}
	})

	t.Run("multi-node reader-only on two nodes", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		img := h.create(mountSpec("pvc-conformance-mnro"))
		for _, n := range []string{NodeA, NodeB} {
			pc := h.publish(img.ID, att(n, backend.MultiNodeReaderOnly, true))
			if pc[backend.ContextReadOnly] != "true" {
				t.Fatalf("publish_context for %s = %v, want %s=true", n, pc, backend.ContextReadOnly)
			}
		}
		if got := nodesOf(h.get(img.ID)); !slices.Equal(got, []string{NodeA, NodeB}) {
			t.Fatalf("attached nodes = %v, want both", got)
		}
		// A single-node writer may not join readers.
		_, err := h.exporter().Publish(h.ctx, img.ID, att(NodeC, backend.SingleNodeWriter, false))
		testutil.WantKind(t, err, errdefs.ErrPrecondition)
		if got := nodesOf(h.get(img.ID)); !slices.Equal(got, []string{NodeA, NodeB}) {
			t.Fatalf("attached nodes after the refused writer = %v, want the two readers", got)
		}
	})

	t.Run("unpublish of a node that never published", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		img := h.create(mountSpec("pvc-conformance-unpub"))
		h.publish(img.ID, att(NodeA, backend.SingleNodeWriter, false))
		h.unpublish(img.ID, NodeB)
		h.unpublish(img.ID, NodeUnregistered)
		if got := nodesOf(h.get(img.ID)); !slices.Equal(got, []string{NodeA}) {
			t.Fatalf("unpublishing other nodes changed the attachments to %v", got)
		}
		h.unpublish(img.ID, NodeA)
		h.unpublish(img.ID, NodeA)
		if a := h.get(img.ID).Attachments; len(a) != 0 {
			t.Fatalf("attachments after unpublish = %v", a)
		}
	})

	t.Run("unpublish after delete", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		h.unpublish(h.missingID(), NodeA)
	})

	t.Run("unregistered node", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		if h.f.NoNodeRegistry != "" {
			t.Skip(h.f.NoNodeRegistry)
		}
		img := h.create(mountSpec("pvc-conformance-unreg"))
		_, err := h.exporter().Publish(h.ctx, img.ID, att(NodeUnregistered, backend.SingleNodeWriter, false))
		testutil.WantKind(t, err, errdefs.ErrNotFound, NodeUnregistered)
		if a := h.get(img.ID).Attachments; len(a) != 0 {
			t.Fatalf("a refused publish left attachments %v", a)
		}
	})

	// Whether or not the new node is known, a volume another node holds is
	// refused naming the holder: that is the message an operator reads in
	// the VolumeAttachment when a pod moves to a node too early.
	t.Run("held volume refused to an unknown node", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		img := h.create(mountSpec("pvc-conformance-held"))
		h.publish(img.ID, att(NodeA, backend.SingleNodeWriter, false))
		_, err := h.exporter().Publish(h.ctx, img.ID, att(NodeUnregistered, backend.SingleNodeWriter, false))
		testutil.WantKind(t, err, errdefs.ErrPrecondition, NodeA)
		if got := nodesOf(h.get(img.ID)); !slices.Equal(got, []string{NodeA}) {
			t.Fatalf("a refused publish changed the attachments to %v", got)
		}
	})

	t.Run("missing image", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		id := h.missingID()
		_, err := h.exporter().Publish(h.ctx, id, att(NodeA, backend.SingleNodeWriter, false))
		testutil.WantKind(t, err, errdefs.ErrNotFound, id)
	})
}

func testDelete(t *testing.T, newFixture Factory) {
	t.Run("while published", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		img := h.create(mountSpec("pvc-conformance-del"))
		h.publish(img.ID, att(NodeA, backend.MultiNodeReaderOnly, true))
		h.publish(img.ID, att(NodeB, backend.MultiNodeReaderOnly, true))
		err := h.store().Delete(h.ctx, img.ID)
		testutil.WantKind(t, err, errdefs.ErrPrecondition, NodeA, NodeB)
		h.get(img.ID) // still there

		h.unpublish(img.ID, NodeA)
		testutil.WantKind(t, h.store().Delete(h.ctx, img.ID), errdefs.ErrPrecondition, NodeB)

		h.unpublish(img.ID, NodeB)
		h.delete(img.ID)
		_, err = h.store().Get(h.ctx, img.ID)
		testutil.WantKind(t, err, errdefs.ErrNotFound)
		h.delete(img.ID)
	})

	t.Run("recreate after delete", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		spec := mountSpec("pvc-conformance-recreate")
		h.delete(h.create(spec).ID)
		// A deleted volume leaves nothing that makes another spec under the
		// same name "already exist".
		spec.CapacityBytes, spec.FsType = 2*VolumeBytes, "xfs"
		checkImage(t, "Create after Delete", h.create(spec), spec)
	})
}

func testExhaustion(t *testing.T, newFixture Factory) {
	h := newHarness(t, newFixture, Options{CapacityBytes: SmallCapacityBytes})
	fits := mountSpec("pvc-conformance-fits")
	fitsImg := h.create(fits)

	before := h.artifacts()
	tooBig := mountSpec("pvc-conformance-too-big")
	tooBig.CapacityBytes = 4 * SmallCapacityBytes
	_, err := h.store().Create(h.ctx, tooBig)
	testutil.WantKind(t, err, errdefs.ErrExhausted)

	if after := h.artifacts(); !slices.Equal(before, after) {
		t.Fatalf("a failed Create changed what the backend holds:\nbefore %q\nafter  %q", before, after)
	}
	if h.f.ImageID != nil {
		id := h.f.ImageID(tooBig.Name)
		_, err := h.store().Get(h.ctx, id)
		testutil.WantKind(t, err, errdefs.ErrNotFound)
	}
	// Growing an image past the capacity is refused the same way.
	_, err = h.store().Expand(h.ctx, fitsImg.ID, 4*SmallCapacityBytes)
	testutil.WantKind(t, err, errdefs.ErrExhausted)
	if after := h.artifacts(); !slices.Equal(before, after) {
		t.Fatalf("a failed Expand changed what the backend holds:\nbefore %q\nafter  %q", before, after)
	}
	checkImage(t, "Get after an exhausted Expand", h.get(fitsImg.ID), fits)

	// Nothing of the failed volume makes a smaller request under its name
	// "already exist".
	again := mountSpec(tooBig.Name)
	checkImage(t, "Create after an exhausted Create", h.create(again), again)
}

func testAttach(t *testing.T, newFixture Factory) {
	t.Run("lifecycle", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		h.needAttach()
		// No fs type in the request: the node picks one and records it.
		spec := mountSpec("pvc-conformance-attach")
		spec.FsType = ""
		img := h.create(spec)
		pc := h.publish(img.ID, att(NodeA, backend.SingleNodeWriter, false))
		req := backend.AttachRequest{ImageID: img.ID, NodeID: NodeA, PublishContext: pc}

		dev := h.attach(req)
		if dev.ReadOnly || dev.Formatted {
			t.Fatalf("first attach = %+v, want read-write and not formatted", dev)
		}
		again := h.attach(req)
		if again.Path != dev.Path {
			t.Fatalf("a second Attach gave %s, the first %s; want the device reused", again.Path, dev.Path)
		}
		if devs := h.devices(img.ID); len(devs) != 1 || devs[0].Path != dev.Path || devs[0].ReadOnly {
			t.Fatalf("Devices = %+v, want just read-write %s", devs, dev.Path)
		}
		if d, err := h.attacher().Identify(h.ctx, img.ID, dev.Path); err != nil || d.Path != dev.Path || d.ReadOnly {
			t.Fatalf("Identify(%s) = %+v, %v; want the read-write device", dev.Path, d, err)
		}
		// The device is this image's, and no other's.
		other := h.create(mountSpec("pvc-conformance-attach-other"))
		_, err := h.attacher().Identify(h.ctx, other.ID, dev.Path)
		testutil.WantKind(t, err, errdefs.ErrNotFound, dev.Path)

		if h.f.NodeWithoutStore != "" {
			// The node's mkfs is the record; RecordFormatted writes
			// nothing, and the controller reads the fact from the image at
			// the next publish.
			if err := h.f.Format(h.ctx, img.ID, "ext4"); err != nil {
				t.Fatalf("Format: %v", err)
			}
			if err := h.attacher().RecordFormatted(h.ctx, img.ID, "ext4"); err != nil {
				t.Fatalf("RecordFormatted: %v", err)
			}
			if got := h.get(img.ID); got.Formatted {
				t.Fatalf("the node's RecordFormatted reached the store (%s): %+v", h.f.NodeWithoutStore, got)
			}
			req.PublishContext = h.publish(img.ID, att(NodeA, backend.SingleNodeWriter, false))
		} else if err := h.attacher().RecordFormatted(h.ctx, img.ID, "ext4"); err != nil {
			t.Fatalf("RecordFormatted: %v", err)
		}
		if got := h.get(img.ID); !got.Formatted || got.FsType != "ext4" {
			t.Fatalf("after the format, Get = Formatted %t FsType %q", got.Formatted, got.FsType)
		}
		// The node learns it through the attach, so it never formats twice.
		if d := h.attach(req); d.Path != dev.Path || !d.Formatted || d.FsType != "ext4" {
			t.Fatalf("Attach after the format = %+v, want %s formatted ext4", d, dev.Path)
		}
		if err := h.attacher().RecordFormatted(h.ctx, img.ID, "ext4"); err != nil {
			t.Fatalf("repeated RecordFormatted: %v", err)
		}

		if err := h.attacher().Detach(h.ctx, img.ID, dev.Path); err != nil {
			t.Fatalf("Detach: %v", err)
		}
		if devs := h.devices(img.ID); len(devs) != 0 {
			t.Fatalf("Devices after Detach = %+v", devs)
		}
		_, err = h.attacher().Identify(h.ctx, img.ID, dev.Path)
		testutil.WantKind(t, err, errdefs.ErrNotFound, dev.Path)
		if err := h.attacher().Detach(h.ctx, img.ID, dev.Path); err != nil {
			t.Fatalf("second Detach: %v", err)
		}
		if err := h.attacher().Detach(h.ctx, img.ID, ""); err != nil {
			t.Fatalf("Detach of every device when none is attached: %v", err)
		}
	})

	t.Run("node not published", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		h.needAttach()
		img := h.create(mountSpec("pvc-conformance-attach-unpub"))
		// Published nowhere yet.
		_, err := h.attacher().Attach(h.ctx, backend.AttachRequest{ImageID: img.ID, NodeID: NodeA, PublishContext: map[string]string{backend.ContextReadOnly: "false"}})
		testutil.WantKind(t, err, errdefs.ErrPrecondition, NodeA)
		// Published to another node.
		pc := h.publish(img.ID, att(NodeB, backend.SingleNodeWriter, false))
		_, err = h.attacher().Attach(h.ctx, backend.AttachRequest{ImageID: img.ID, NodeID: NodeA, PublishContext: pc})
		testutil.WantKind(t, err, errdefs.ErrPrecondition, NodeA)
		if devs := h.devices(img.ID); len(devs) != 0 {
			t.Fatalf("a refused Attach left devices %+v", devs)
		}
	})

	t.Run("read-only", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		h.needAttach()
		img := h.create(blockSpec("pvc-conformance-attach-ro"))
		pc := h.publish(img.ID, att(NodeA, backend.SingleNodeWriter, true))
		dev := h.attach(backend.AttachRequest{ImageID: img.ID, NodeID: NodeA, PublishContext: pc, ReadOnly: true})
		if !dev.ReadOnly {
			t.Fatalf("Attach of a read-only publish = %+v, want read-only", dev)
		}
		if devs := h.devices(img.ID); len(devs) != 1 || !devs[0].ReadOnly {
			t.Fatalf("Devices = %+v, want one read-only", devs)
		}
	})

	t.Run("missing image", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		h.needAttach()
		id := h.missingID()
		_, err := h.attacher().Attach(h.ctx, backend.AttachRequest{ImageID: id, NodeID: NodeA})
		if h.f.NodeWithoutStore != "" && errdefs.KindOf(err) == errdefs.ErrPrecondition {
			testutil.WantKind(t, err, errdefs.ErrPrecondition, id, NodeA)
		} else {
			testutil.WantKind(t, err, errdefs.ErrNotFound, id)
		}
		if err := h.attacher().Detach(h.ctx, id, ""); err != nil {
			t.Fatalf("Detach of a deleted image with nothing attached: %v", err)
		}
		if h.f.NodeWithoutStore == "" {
			testutil.WantKind(t, h.attacher().RecordFormatted(h.ctx, id, "ext4"), errdefs.ErrNotFound)
		}
	})
}

func testConcurrency(t *testing.T, newFixture Factory) {
	const n = 8
	t.Run("create the same name", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		spec := mountSpec("pvc-conformance-race")
		ids := make([]string, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				img, err := h.store().Create(h.ctx, spec)
				errs[i] = err
				if err == nil {
					ids[i] = img.ID
				}
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("Create #%d: %v", i, err)
			}
		}
		if u := slices.Compact(slices.Sorted(slices.Values(ids))); len(u) != 1 {
			t.Fatalf("concurrent Creates of one name returned image IDs %v, want one", ids)
		}
		checkImage(t, "Get after the race", h.get(ids[0]), spec)
	})

	t.Run("publish a single-node volume to two nodes", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		img := h.create(mountSpec("pvc-conformance-pub-race"))
		nodes := []string{NodeA, NodeB}
		errs := make([]error, len(nodes))
		var wg sync.WaitGroup
		for i, node := range nodes {
			wg.Go(func() {
				_, errs[i] = h.exporter().Publish(h.ctx, img.ID, att(node, backend.SingleNodeWriter, false))
			})
		}
		wg.Wait()
		var won []string
		for i, err := range errs {
			switch {
			case err == nil:
				won = append(won, nodes[i])
			case errdefs.KindOf(err) != errdefs.ErrPrecondition:
				t.Fatalf("the losing publish to %s failed with %v, want a precondition", nodes[i], err)
			}
		}
		if len(won) != 1 {
			t.Fatalf("nodes granted a single-node volume at once: %v (errors %v)", won, errs)
		}
		if got := nodesOf(h.get(img.ID)); !slices.Equal(got, won) {
			t.Fatalf("attached nodes = %v, want the winner %v", got, won)
		}
	})
}
