package conformance

import (
	"maps"
	"slices"
	"strconv"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// capacitySlack is how far a store's capacity may stray from the sizes of
// its images: its own metadata takes some room on a real filesystem.
const capacitySlack = MiB

// unknownMutableKey is a mutable parameter no backend understands.
const unknownMutableKey = "conformance.example/unknown-key"

func (h *harness) list() []*backend.Image {
	h.t.Helper()
	imgs, err := h.store().List(h.ctx)
	if err != nil {
		h.t.Fatalf("List: %v", err)
	}
	return imgs
}

func (h *harness) capacity() backend.Capacity {
	h.t.Helper()
	c, err := h.store().Capacity(h.ctx)
	if err != nil {
		h.t.Fatalf("Capacity: %v", err)
	}
	return c
}

func (h *harness) expand(id string, size int64) *backend.Image {
	h.t.Helper()
	img, err := h.store().Expand(h.ctx, id, size)
	if err != nil {
		h.t.Fatalf("Expand(%s, %d): %v", id, size, err)
	}
	return img
}

func idsOf(imgs []*backend.Image) []string {
	out := make([]string, 0, len(imgs))
	for _, img := range imgs {
		out = append(out, img.ID)
	}
	return out
}

func testList(t *testing.T, newFixture Factory) {
	h := newHarness(t, newFixture, Options{})
	if got := h.list(); len(got) != 0 {
		t.Fatalf("a fresh instance lists %v", idsOf(got))
	}
	specs := []backend.VolumeSpec{
		blockSpec("pvc-conformance-list-b"),
		mountSpec("pvc-conformance-list-a"),
		mountSpec("A Volume/with:odd*chars"),
	}
	names := map[string]string{} // ID -> name
	for _, spec := range specs {
		names[h.create(spec).ID] = spec.Name
	}
	got := h.list()
	ids := idsOf(got)
	if !slices.IsSorted(ids) {
		t.Fatalf("List IDs %v are not sorted", ids)
	}
	if want := slices.Sorted(maps.Keys(names)); !slices.Equal(ids, want) {
		t.Fatalf("List = %v, want the created %v", ids, want)
	}
	for _, img := range got {
		if img.Name != names[img.ID] || img.CapacityBytes != VolumeBytes {
			t.Errorf("List entry %s: Name %q CapacityBytes %d, want %q and %d", img.ID, img.Name, img.CapacityBytes, names[img.ID], VolumeBytes)
		}
	}

	gone := ids[1]
	h.delete(gone)
	ids = idsOf(h.list())
	if slices.Contains(ids, gone) || len(ids) != len(specs)-1 {
		t.Fatalf("List after deleting %s = %v", gone, ids)
	}
}

func testExpand(t *testing.T, newFixture Factory) {
	h := newHarness(t, newFixture, Options{})
	spec := mountSpec("pvc-conformance-expand")
	img := h.create(spec)

	grown := h.expand(img.ID, 2*VolumeBytes)
	want := spec
	want.CapacityBytes = 2 * VolumeBytes
	checkImage(t, "Expand", grown, want)
	checkImage(t, "Get after Expand", h.get(img.ID), want)

	// The same size again: a retried ControllerExpandVolume.
	checkImage(t, "Expand to the same size", h.expand(img.ID, 2*VolumeBytes), want)

	_, err := h.store().Expand(h.ctx, img.ID, VolumeBytes)
	testutil.WantKind(t, err, errdefs.ErrOutOfRange, strconv.FormatInt(2*VolumeBytes, 10), strconv.FormatInt(VolumeBytes, 10))
	checkImage(t, "Get after a refused shrink", h.get(img.ID), want)

	missing := h.missingID()
	_, err = h.store().Expand(h.ctx, missing, 2*VolumeBytes)
	testutil.WantKind(t, err, errdefs.ErrNotFound, missing)

	// Online expansion: a published image grows and stays published.
	pub := h.create(blockSpec("pvc-conformance-expand-published"))
	h.publish(pub.ID, att(NodeA, backend.SingleNodeWriter, false))
	if got := h.expand(pub.ID, 3*VolumeBytes); got.CapacityBytes != 3*VolumeBytes {
		t.Fatalf("Expand of a published image = %d bytes, want %d", got.CapacityBytes, 3*VolumeBytes)
	}
	if got := h.get(pub.ID); got.CapacityBytes != 3*VolumeBytes || !slices.Equal(nodesOf(got), []string{NodeA}) {
		t.Fatalf("after Expand, Get = %d bytes published to %v; want %d bytes on %s", got.CapacityBytes, nodesOf(got), 3*VolumeBytes, NodeA)
	}
}

func testModify(t *testing.T, newFixture Factory) {
	h := newHarness(t, newFixture, Options{})
	valid := h.f.MutableParameters
	unknown := map[string]string{unknownMutableKey: "x"}

	t.Run("unknown key", func(t *testing.T) {
		h := h.sub(t)
		img := h.create(mountSpec("pvc-conformance-modify-unknown"))
		_, err := h.store().Modify(h.ctx, img.ID, unknown)
		testutil.WantKind(t, err, errdefs.ErrInvalidArgument, unknownMutableKey)
		if got := h.get(img.ID).MutableParameters; len(got) != 0 {
			t.Fatalf("a refused Modify left mutable parameters %v", got)
		}
	})

	t.Run("unknown key at create", func(t *testing.T) {
		h := h.sub(t)
		spec := mountSpec("pvc-conformance-modify-create-unknown")
		spec.MutableParameters = unknown
		before := h.artifacts()
		_, err := h.store().Create(h.ctx, spec)
		testutil.WantKind(t, err, errdefs.ErrInvalidArgument, unknownMutableKey)
		if after := h.artifacts(); !slices.Equal(before, after) {
			t.Fatalf("a refused Create changed what the backend holds:\nbefore %q\nafter  %q", before, after)
		}
		if h.f.ImageID != nil {
			_, err := h.store().Get(h.ctx, h.f.ImageID(spec.Name))
			testutil.WantKind(t, err, errdefs.ErrNotFound)
		}
	})

	t.Run("missing image", func(t *testing.T) {
		h := h.sub(t)
		id := h.missingID()
		_, err := h.store().Modify(h.ctx, id, valid)
		testutil.WantKind(t, err, errdefs.ErrNotFound, id)
	})

	t.Run("valid", func(t *testing.T) {
		h := h.sub(t)
		if valid == nil {
			t.Skip("the fixture names no valid mutable parameters")
		}
		spec := mountSpec("pvc-conformance-modify")
		img := h.create(spec)
		got, err := h.store().Modify(h.ctx, img.ID, maps.Clone(valid))
		if err != nil {
			t.Fatalf("Modify(%v): %v", valid, err)
		}
		for _, i := range []*backend.Image{got, h.get(img.ID)} {
			if !maps.Equal(i.MutableParameters, valid) {
				t.Fatalf("after Modify, MutableParameters = %v, want %v", i.MutableParameters, valid)
			}
			checkImage(t, "after Modify", i, spec)
		}
		// A repeat, and an empty change, keep what is there.
		for _, m := range []map[string]string{valid, nil} {
			if got, err := h.store().Modify(h.ctx, img.ID, m); err != nil || !maps.Equal(got.MutableParameters, valid) {
				t.Fatalf("Modify(%v) = %v, %v; want %v kept", m, got.MutableParameters, err, valid)
			}
		}
	})

	t.Run("valid at create", func(t *testing.T) {
		h := h.sub(t)
		if valid == nil {
			t.Skip("the fixture names no valid mutable parameters")
		}
		spec := mountSpec("pvc-conformance-modify-create")
		spec.MutableParameters = maps.Clone(valid)
		img := h.create(spec)
		if !maps.Equal(img.MutableParameters, valid) || !maps.Equal(h.get(img.ID).MutableParameters, valid) {
			t.Fatalf("Create kept mutable parameters %v, want %v", img.MutableParameters, valid)
		}
		if again := h.create(spec); again.ID != img.ID {
			t.Fatalf("a repeated Create returned %s, the first %s", again.ID, img.ID)
		}
		other := mountSpec(spec.Name)
		_, err := h.store().Create(h.ctx, other)
		testutil.WantKind(t, err, errdefs.ErrAlreadyExists, spec.Name)
	})
}

func testCapacity(t *testing.T, newFixture Factory) {
	t.Run("unbounded", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{})
		c := h.capacity()
		if c.AvailableBytes <= 0 || c.MaximumVolumeBytes <= 0 || c.MaximumVolumeBytes > c.AvailableBytes {
			t.Fatalf("Capacity of a fresh instance = %+v; want both positive, the maximum volume at most the total", c)
		}
	})

	t.Run("bounded", func(t *testing.T) {
		h := newHarness(t, newFixture, Options{CapacityBytes: SmallCapacityBytes})
		before := h.capacity()
		if before.AvailableBytes <= 0 || before.AvailableBytes > SmallCapacityBytes+capacitySlack {
			t.Fatalf("Capacity = %+v of an instance of %d bytes", before, SmallCapacityBytes)
		}
		img := h.create(blockSpec("pvc-conformance-capacity"))
		after := h.capacity()
		if drop := before.AvailableBytes - after.AvailableBytes; drop < VolumeBytes-capacitySlack {
			t.Fatalf("available bytes went from %d to %d after a %d-byte volume was created", before.AvailableBytes, after.AvailableBytes, VolumeBytes)
		}
		if after.MaximumVolumeBytes > after.AvailableBytes {
			t.Fatalf("Capacity = %+v: the largest volume exceeds the total", after)
		}
		h.delete(img.ID)
		if freed := h.capacity(); freed.AvailableBytes < after.AvailableBytes+VolumeBytes-capacitySlack {
			t.Fatalf("available bytes went from %d to %d when the %d-byte volume was deleted", after.AvailableBytes, freed.AvailableBytes, VolumeBytes)
		}
	})
}

// testAttachLimit: a node registered with MaxVolumesPerNode takes that many
// volumes and no more.
func testAttachLimit(t *testing.T, newFixture Factory) {
	h := newHarness(t, newFixture, Options{})
	const limited = "node-limited"
	if err := h.registerNode(backend.NodeInfo{NodeID: limited, MaxVolumesPerNode: 2}); err != nil {
		t.Fatalf("register node %s: %v", limited, err)
	}
	var imgs []*backend.Image
	for i := range 3 {
		imgs = append(imgs, h.create(blockSpec("pvc-conformance-limit-"+strconv.Itoa(i))))
	}
	h.publish(imgs[0].ID, att(limited, backend.SingleNodeWriter, false))
	h.publish(imgs[1].ID, att(limited, backend.SingleNodeWriter, false))

	_, err := h.exporter().Publish(h.ctx, imgs[2].ID, att(limited, backend.SingleNodeWriter, false))
	testutil.WantKind(t, err, errdefs.ErrExhausted, limited, "2")
	if a := h.get(imgs[2].ID).Attachments; len(a) != 0 {
		t.Fatalf("a publish refused for the limit left attachments %v", a)
	}
	// A repeat of a publish the node has is not a new volume.
	h.publish(imgs[0].ID, att(limited, backend.SingleNodeWriter, false))
	// The limit is the node's own: others still get the volume.
	h.publish(imgs[2].ID, att(NodeA, backend.SingleNodeWriter, false))
	h.unpublish(imgs[2].ID, NodeA)

	h.unpublish(imgs[1].ID, limited)
	h.publish(imgs[2].ID, att(limited, backend.SingleNodeWriter, false))
	for i, want := range [][]string{{limited}, nil, {limited}} {
		if got := nodesOf(h.get(imgs[i].ID)); !slices.Equal(got, want) {
			t.Fatalf("volume %d is published to %v, want %v", i, got, want)
		}
	}
}

// testRefresh: an attached device sees its image grow.
func testRefresh(t *testing.T, newFixture Factory) {
	h := newHarness(t, newFixture, Options{})
	h.needAttach()
	img := h.create(blockSpec("pvc-conformance-refresh"))
	pc := h.publish(img.ID, att(NodeA, backend.SingleNodeWriter, false))
	dev := h.attach(backend.AttachRequest{ImageID: img.ID, NodeID: NodeA, PublishContext: pc})

	refresh := func(want int64) {
		t.Helper()
		size, err := h.attacher().Refresh(h.ctx, img.ID, dev.Path)
		if err != nil {
			t.Fatalf("Refresh(%s): %v", dev.Path, err)
		}
		if size != want {
			t.Fatalf("Refresh(%s) = %d bytes, want %d", dev.Path, size, want)
		}
	}
	refresh(VolumeBytes)
	h.expand(img.ID, 2*VolumeBytes)
	refresh(2 * VolumeBytes)
	refresh(2 * VolumeBytes)

	other := h.create(blockSpec("pvc-conformance-refresh-other"))
	_, err := h.attacher().Refresh(h.ctx, other.ID, dev.Path)
	testutil.WantKind(t, err, errdefs.ErrNotFound, dev.Path)
}
