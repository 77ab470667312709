package conformance

import (
	"bytes"
	"slices"
	"strconv"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// contentOffsets are where the content checks write: the start of an image
// and a second, separate extent, so a copy that keeps holes must copy both.
var contentOffsets = []int64{0, 3 * MiB}

// contentLen is the size of each region the content checks write.
const contentLen = 64 << 10

// pattern is recognisable content for generation gen: no two generations
// and no two regions are alike, and none is all zeros.
func pattern(gen byte, region int) []byte {
	b := bytes.Repeat([]byte{'s', 'p', 'i', 'n', gen, byte('0' + region)}, contentLen/6+1)
	return b[:contentLen]
}

func (h *harness) hasContent() bool { return h.f.WriteImage != nil && h.f.ReadImage != nil }

// writeContent writes generation gen into every content region of the image.
func (h *harness) writeContent(id string, gen byte) {
	h.t.Helper()
	for i, off := range contentOffsets {
		if err := h.f.WriteImage(h.ctx, id, off, pattern(gen, i)); err != nil {
			h.t.Fatalf("WriteImage(%s, %d): %v", id, off, err)
		}
	}
}

// checkContent fails unless the image holds generation gen.
func (h *harness) checkContent(what, id string, gen byte) {
	h.t.Helper()
	for i, off := range contentOffsets {
		got, err := h.f.ReadImage(h.ctx, id, off, contentLen)
		if err != nil {
			h.t.Fatalf("ReadImage(%s, %d): %v", id, off, err)
		}
		if !bytes.Equal(got, pattern(gen, i)) {
			h.t.Fatalf("%s: image %s at offset %d holds %q..., want generation %q", what, id, off, got[:min(len(got), 12)], gen)
		}
	}
}

func (h *harness) snapshotter() backend.Snapshotter {
	h.t.Helper()
	if h.f.Instance.Snapshots == nil {
		h.t.Skip("the instance takes no snapshots (Instance.Snapshots is nil)")
	}
	return h.f.Instance.Snapshots
}

func (h *harness) createSnapshot(spec backend.SnapshotSpec) *backend.Snapshot {
	h.t.Helper()
	snap, err := h.snapshotter().CreateSnapshot(h.ctx, spec)
	if err != nil {
		h.t.Fatalf("CreateSnapshot(%q of %s): %v", spec.Name, spec.SourceImageID, err)
	}
	if snap == nil || snap.ID == "" {
		h.t.Fatalf("CreateSnapshot(%q) returned no snapshot ID: %+v", spec.Name, snap)
	}
	return snap
}

func (h *harness) listSnapshots() []string {
	h.t.Helper()
	snaps, err := h.snapshotter().ListSnapshots(h.ctx)
	if err != nil {
		h.t.Fatalf("ListSnapshots: %v", err)
	}
	var ids []string
	for _, s := range snaps {
		ids = append(ids, s.ID)
	}
	return ids
}

// formatted makes the image formatted with fsType the way a node would, when
// the fixture has an attacher; it reports whether it did, so the suite knows
// which "formatted" flag a copy must inherit. For a node without a store,
// the filesystem is written and the controller learns it by publishing the
// volume (to NodeC, then unpublishing it).
func (h *harness) formatted(id, fsType string) bool {
	h.t.Helper()
	if h.f.Instance.Attacher == nil {
		return false
	}
	if h.f.NodeWithoutStore != "" {
		if err := h.f.Format(h.ctx, id, fsType); err != nil {
			h.t.Fatalf("Format(%s): %v", id, err)
		}
		h.publish(id, att(NodeC, backend.SingleNodeWriter, false))
		h.unpublish(id, NodeC)
		if img := h.get(id); !img.Formatted || img.FsType != fsType {
			h.t.Fatalf("after a publish of %s holding %s, Get = Formatted %t FsType %q; want the controller to have learned it", id, fsType, img.Formatted, img.FsType)
		}
		return true
	}
	if err := h.attacher().RecordFormatted(h.ctx, id, fsType); err != nil {
		h.t.Fatalf("RecordFormatted(%s): %v", id, err)
	}
	return true
}

// checkSnapshot compares a snapshot with what its source was when taken.
func checkSnapshot(t *testing.T, what string, snap *backend.Snapshot, name string, src *backend.Image) {
	t.Helper()
	if snap.Name != name || snap.SourceImageID != src.ID {
		t.Errorf("%s: Name %q of %s, want %q of %s", what, snap.Name, snap.SourceImageID, name, src.ID)
	}
	if snap.SizeBytes != src.CapacityBytes {
		t.Errorf("%s: SizeBytes = %d, want the source's %d", what, snap.SizeBytes, src.CapacityBytes)
	}
	if !snap.ReadyToUse || snap.CreatedAt.IsZero() {
		t.Errorf("%s: ReadyToUse %t, CreatedAt %v; want ready with a creation time", what, snap.ReadyToUse, snap.CreatedAt)
	}
	if snap.AccessType != src.AccessType || snap.FsType != src.FsType || snap.Formatted != src.Formatted {
		t.Errorf("%s: %s %q formatted=%t, want the source's %s %q formatted=%t", what, snap.AccessType, snap.FsType, snap.Formatted, src.AccessType, src.FsType, src.Formatted)
	}
}

func sameSnapshot(a, b *backend.Snapshot) bool {
	return a.ID == b.ID && a.Name == b.Name && a.SourceImageID == b.SourceImageID && a.SizeBytes == b.SizeBytes &&
		a.CreatedAt.Equal(b.CreatedAt) && a.ReadyToUse == b.ReadyToUse && a.AccessType == b.AccessType &&
		a.FsType == b.FsType && a.Formatted == b.Formatted
}

func testSnapshots(t *testing.T, newFixture Factory) {
	h := newHarness(t, newFixture, Options{})
	snaps := h.snapshotter()
	src := h.create(mountSpec("pvc-conformance-snap-src"))
	h.formatted(src.ID, "ext4")
	src = h.get(src.ID)
	if h.hasContent() {
		h.writeContent(src.ID, 'A')
	}

	spec := backend.SnapshotSpec{Name: "snapshot-conformance-1", SourceImageID: src.ID}
	snap := h.createSnapshot(spec)
	checkSnapshot(t, "CreateSnapshot", snap, spec.Name, src)

	again := h.createSnapshot(spec)
	if !sameSnapshot(again, snap) {
		t.Fatalf("a repeated CreateSnapshot = %+v, the first %+v", again, snap)
	}

	other := h.create(blockSpec("pvc-conformance-snap-other"))
	_, err := snaps.CreateSnapshot(h.ctx, backend.SnapshotSpec{Name: spec.Name, SourceImageID: other.ID})
	testutil.WantKind(t, err, errdefs.ErrAlreadyExists, spec.Name)

	missing := h.missingID()
	_, err = snaps.CreateSnapshot(h.ctx, backend.SnapshotSpec{Name: "snapshot-conformance-orphan", SourceImageID: missing})
	testutil.WantKind(t, err, errdefs.ErrNotFound, missing)

	got, err := snaps.GetSnapshot(h.ctx, snap.ID)
	if err != nil || !sameSnapshot(got, snap) {
		t.Fatalf("GetSnapshot = %+v, %v; want %+v", got, err, snap)
	}

	second := h.createSnapshot(backend.SnapshotSpec{Name: "snapshot-conformance-2", SourceImageID: other.ID})
	checkSnapshot(t, "CreateSnapshot of a block volume", second, "snapshot-conformance-2", other)
	ids := h.listSnapshots()
	if want := slices.Sorted(slices.Values([]string{snap.ID, second.ID})); !slices.Equal(ids, want) {
		t.Fatalf("ListSnapshots = %v, want %v (sorted)", ids, want)
	}

	// The snapshot keeps the source as it was; the source goes on changing.
	if h.hasContent() {
		h.writeContent(src.ID, 'B')
		restored := mountSpec("pvc-conformance-snap-restored")
		restored.Source = &backend.ContentSource{SnapshotID: snap.ID}
		img := h.create(restored)
		h.checkContent("a volume restored from the snapshot", img.ID, 'A')
		h.checkContent("the source after the snapshot", src.ID, 'B')
	}

	// A snapshot does not depend on its source volume.
	h.delete(src.ID)
	if _, err := snaps.GetSnapshot(h.ctx, snap.ID); err != nil {
		t.Fatalf("GetSnapshot after its source was deleted: %v", err)
	}
	late := mountSpec("pvc-conformance-snap-late")
	late.Source = &backend.ContentSource{SnapshotID: snap.ID}
	img := h.create(late)
	if h.hasContent() {
		h.checkContent("a volume restored after the source was deleted", img.ID, 'A')
	}

	if err := snaps.DeleteSnapshot(h.ctx, snap.ID); err != nil {
		t.Fatalf("DeleteSnapshot: %v", err)
	}
	_, err = snaps.GetSnapshot(h.ctx, snap.ID)
	testutil.WantKind(t, err, errdefs.ErrNotFound, snap.ID)
	if err := snaps.DeleteSnapshot(h.ctx, snap.ID); err != nil {
		t.Fatalf("DeleteSnapshot of a deleted snapshot: %v", err)
	}
	if ids := h.listSnapshots(); !slices.Equal(ids, []string{second.ID}) {
		t.Fatalf("ListSnapshots after a delete = %v, want [%s]", ids, second.ID)
	}
	// The volume restored from it is a copy and stays.
	h.get(img.ID)
	if h.hasContent() {
		h.checkContent("a restored volume after its snapshot was deleted", img.ID, 'A')
	}
}

// copyKind builds a content source of one kind from a source volume.
type copyKind struct {
	name string
	// source returns a content source holding src as it is now, and a
	// well-formed source of the same kind that does not exist.
	source func(h *harness, src *backend.Image) (have, missing backend.ContentSource)
}

var copyKinds = []copyKind{
	{"from volume", func(h *harness, src *backend.Image) (backend.ContentSource, backend.ContentSource) {
		return backend.ContentSource{ImageID: src.ID}, backend.ContentSource{ImageID: h.missingID()}
	}},
	{"from snapshot", func(h *harness, src *backend.Image) (backend.ContentSource, backend.ContentSource) {
		snap := h.createSnapshot(backend.SnapshotSpec{Name: "snapshot-conformance-clone", SourceImageID: src.ID})
		gone := h.createSnapshot(backend.SnapshotSpec{Name: "snapshot-conformance-gone", SourceImageID: src.ID})
		if err := h.snapshotter().DeleteSnapshot(h.ctx, gone.ID); err != nil {
			h.t.Fatalf("DeleteSnapshot: %v", err)
		}
		return backend.ContentSource{SnapshotID: snap.ID}, backend.ContentSource{SnapshotID: gone.ID}
	}},
}

func testClone(t *testing.T, newFixture Factory) {
	for _, kind := range copyKinds {
		t.Run(kind.name, func(t *testing.T) {
			h := newHarness(t, newFixture, Options{})
			srcSpec := mountSpec("pvc-conformance-clone-src")
			src := h.create(srcSpec)
			formatted := h.formatted(src.ID, "ext4")
			if h.hasContent() {
				h.writeContent(src.ID, 'A')
			}
			source, missing := kind.source(h, src)
			// The copies hold generation A. Of a snapshot, they do even when
			// the source volume has moved on to B since.
			srcGen := byte('A')
			if h.hasContent() && source.SnapshotID != "" {
				h.writeContent(src.ID, 'B')
				srcGen = 'B'
			}

			clone := func(name string, change func(*backend.VolumeSpec)) (backend.VolumeSpec, *backend.Image, error) {
				spec := mountSpec(name)
				s := source
				spec.Source = &s
				change(&spec)
				img, err := h.store().Create(h.ctx, spec)
				return spec, img, err
			}
			checkCopy := func(t *testing.T, what string, img *backend.Image, size int64) {
				t.Helper()
				if img.Source == nil || *img.Source != source {
					t.Errorf("%s: Source = %+v, want %+v", what, img.Source, source)
				}
				if img.AccessType != backend.AccessMount || img.FsType != "ext4" || img.Formatted != formatted {
					t.Errorf("%s: %s %q formatted=%t, want the source's mount \"ext4\" formatted=%t", what, img.AccessType, img.FsType, img.Formatted, formatted)
				}
				if img.CapacityBytes != size {
					t.Errorf("%s: CapacityBytes = %d, want %d", what, img.CapacityBytes, size)
				}
				if len(img.Attachments) != 0 {
					t.Errorf("%s: a new copy has attachments %v", what, img.Attachments)
				}
			}

			t.Run("bigger", func(t *testing.T) {
				h := h.sub(t)
				spec, img, err := clone("pvc-conformance-clone-big", func(s *backend.VolumeSpec) { s.CapacityBytes = 2 * VolumeBytes })
				if err != nil {
					t.Fatalf("Create: %v", err)
				}
				checkCopy(t, "Create", img, 2*VolumeBytes)
				checkCopy(t, "Get", h.get(img.ID), 2*VolumeBytes)
				if h.hasContent() {
					h.checkContent("the copy", img.ID, 'A')
				}
				if again := h.create(spec); again.ID != img.ID {
					t.Fatalf("a repeated Create returned %s, the first %s", again.ID, img.ID)
				}
				// The same name from another source, or from none, is another volume.
				for _, other := range []*backend.ContentSource{&missing, nil} {
					spec.Source = other
					_, err := h.store().Create(h.ctx, spec)
					testutil.WantKind(t, err, errdefs.ErrAlreadyExists, spec.Name)
				}
			})

			t.Run("same size, fs type left to the source", func(t *testing.T) {
				h := h.sub(t)
				spec, img, err := clone("pvc-conformance-clone-same", func(s *backend.VolumeSpec) { s.FsType = "" })
				if err != nil {
					t.Fatalf("Create: %v", err)
				}
				checkCopy(t, "Create", img, VolumeBytes)
				// The repeat, asking for no fs type again, is the same volume.
				if again := h.create(spec); again.ID != img.ID || again.FsType != "ext4" {
					t.Fatalf("a repeated Create = %s %q, want %s \"ext4\"", again.ID, again.FsType, img.ID)
				}
				if h.hasContent() {
					// A copy is independent of its source both ways.
					h.writeContent(img.ID, 'C')
					h.checkContent("the copy after writing it", img.ID, 'C')
					h.checkContent("the copy's source volume", src.ID, srcGen)
				}
			})

			t.Run("smaller", func(t *testing.T) {
				h := h.sub(t)
				spec, _, err := clone("pvc-conformance-clone-small", func(s *backend.VolumeSpec) { s.CapacityBytes = VolumeBytes / 2 })
				testutil.WantKind(t, err, errdefs.ErrOutOfRange, strconv.FormatInt(VolumeBytes, 10), strconv.FormatInt(VolumeBytes/2, 10))
				h.noVolume(spec.Name)
			})

			t.Run("missing source", func(t *testing.T) {
				h := h.sub(t)
				spec, _, err := clone("pvc-conformance-clone-missing", func(s *backend.VolumeSpec) { s.Source = &missing })
				testutil.WantKind(t, err, errdefs.ErrNotFound, missing.ImageID+missing.SnapshotID)
				h.noVolume(spec.Name)
			})

			t.Run("other access type", func(t *testing.T) {
				h := h.sub(t)
				spec, _, err := clone("pvc-conformance-clone-block", func(s *backend.VolumeSpec) { s.AccessType, s.FsType, s.Parameters = backend.AccessBlock, "", nil })
				testutil.WantKind(t, err, errdefs.ErrInvalidArgument)
				h.noVolume(spec.Name)
			})

			t.Run("other fs type", func(t *testing.T) {
				h := h.sub(t)
				spec, _, err := clone("pvc-conformance-clone-xfs", func(s *backend.VolumeSpec) { s.FsType = "xfs" })
				testutil.WantKind(t, err, errdefs.ErrInvalidArgument, "xfs")
				h.noVolume(spec.Name)
			})

			t.Run("both sources", func(t *testing.T) {
				h := h.sub(t)
				spec, _, err := clone("pvc-conformance-clone-both", func(s *backend.VolumeSpec) {
					s.Source = &backend.ContentSource{ImageID: src.ID, SnapshotID: "snapshot-conformance-clone"}
				})
				testutil.WantKind(t, err, errdefs.ErrInvalidArgument)
				h.noVolume(spec.Name)
			})
		})
	}

	// A backend may refuse to copy a volume that a node may be writing, when
	// it cannot copy it at one instant; it must say so, and copy it once the
	// volume is unpublished.
	t.Run("published source", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		src := h.create(blockSpec("pvc-conformance-clone-busy"))
		h.publish(src.ID, att(NodeA, backend.SingleNodeWriter, false))
		spec := blockSpec("pvc-conformance-clone-of-busy")
		spec.Source = &backend.ContentSource{ImageID: src.ID}
		_, err := h.store().Create(h.ctx, spec)
		if err == nil {
			return
		}
		// Refused: a precondition failure naming the source, and nothing made.
		testutil.WantKind(t, err, errdefs.ErrPrecondition, src.ID)
		h.noVolume(spec.Name)
		h.unpublish(src.ID, NodeA)
		h.create(spec)
	})
}

// noVolume fails if a volume of that name can be found after a refused Create.
func (h *harness) noVolume(name string) {
	h.t.Helper()
	if h.f.ImageID == nil {
		return
	}
	if _, err := h.store().Get(h.ctx, h.f.ImageID(name)); errdefs.KindOf(err) != errdefs.ErrNotFound {
		h.t.Fatalf("a refused Create of %q left a volume behind (Get: %v)", name, err)
	}
}
