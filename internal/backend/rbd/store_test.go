package rbd_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/rbd"
	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/ceph/cephfake"
	"github.com/spindle-csi/spindle/internal/ceph/cephtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// The store's behaviour on a cluster: the same cases on the in-memory
// cluster and on a real one (cluster_test.go).

// TestVolumes: create (again with the same request: the same volume; with
// another: refused naming the difference), read, list, grow (never
// shrink), modify, capacity, probe, delete (refused while published;
// again: done).
func TestVolumes(t *testing.T) {
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		inst, store, ctx, _ := controller(t, c, rbd.Config{})
		spec := backend.VolumeSpec{Name: "pvc-1", CapacityBytes: 64 * MiB, AccessType: backend.AccessMount, FsType: "ext4",
			Parameters: map[string]string{rbd.ParamImageFeatures: "layering,exclusive-lock"}}
		img := mustCreate(t, ctx, inst, spec)
		if img.ID != store.ImageID("pvc-1") || img.Name != "pvc-1" || img.CapacityBytes != 64*MiB || img.FsType != "ext4" || img.Formatted {
			t.Fatalf("Create = %+v", img)
		}
		again := mustCreate(t, ctx, inst, spec)
		if again.ID != img.ID || !again.CreatedAt.Equal(img.CreatedAt) {
			t.Fatalf("Create again = %+v; want the same volume %+v", again, img)
		}
		other := spec
		other.CapacityBytes = 128 * MiB
		_, err := inst.Store.Create(ctx, other)
		testutil.WantKind(t, err, errdefs.ErrAlreadyExists, "its size is 67108864 bytes, not 134217728")
		info, err := c.direct.StatImage(ctx, c.spec(imageOf(t, c, img.ID)), "")
		if err != nil || !slices.Contains(info.Features, "exclusive-lock") {
			t.Fatalf("the image's features %v (%v); want the class's", info, err)
		}

		list, err := inst.Store.List(ctx)
		if err != nil || len(list) != 1 || list[0].ID != img.ID {
			t.Fatalf("List = %+v, %v", list, err)
		}
		grown, err := inst.Store.Expand(ctx, img.ID, 96*MiB)
		if err != nil || grown.CapacityBytes != 96*MiB {
			t.Fatalf("Expand = %+v, %v", grown, err)
		}
		_, err = inst.Store.Expand(ctx, img.ID, 32*MiB)
		testutil.WantKind(t, err, errdefs.ErrOutOfRange, "cannot shrink")
		mod, err := inst.Store.Modify(ctx, img.ID, map[string]string{rbd.MutableParamMapOptions: "noudev"})
		if err != nil || mod.MutableParameters[rbd.MutableParamMapOptions] != "noudev" {
			t.Fatalf("Modify = %+v, %v", mod, err)
		}
		_, err = inst.Store.Modify(ctx, img.ID, map[string]string{"qos": "1"})
		testutil.WantKind(t, err, errdefs.ErrInvalidArgument, `"qos" is not supported`)
		if got, err := inst.Store.Get(ctx, img.ID); err != nil || got.MutableParameters[rbd.MutableParamMapOptions] != "noudev" || got.CapacityBytes != 96*MiB {
			t.Fatalf("Get = %+v, %v", got, err)
		}
		if capa, err := inst.Store.Capacity(ctx); err != nil || capa.AvailableBytes <= 0 {
			t.Fatalf("Capacity = %+v, %v", capa, err)
		}
		if err := inst.Store.Probe(ctx); err != nil {
			t.Fatalf("Probe: %v", err)
		}

		if _, err := inst.Exporter.Publish(ctx, img.ID, backend.Attachment{NodeID: "node-a", AccessMode: backend.SingleNodeWriter}); err != nil {
			t.Fatal(err)
		}
		testutil.WantKind(t, inst.Store.Delete(ctx, img.ID), errdefs.ErrPrecondition, `published to node "node-a"`)
		if err := inst.Exporter.Unpublish(ctx, img.ID, "node-a"); err != nil {
			t.Fatal(err)
		}
		if err := inst.Store.Delete(ctx, img.ID); err != nil {
			t.Fatal(err)
		}
		if err := inst.Store.Delete(ctx, img.ID); err != nil {
			t.Fatalf("Delete again: %v", err)
		}
		_, err = inst.Store.Get(ctx, img.ID)
		testutil.WantKind(t, err, errdefs.ErrNotFound, "does not exist")
		settle(t, ctx, c, store)
	})
}

// TestMaxProvisionedBytes: past the instance's cap a create is refused as
// exhausted, naming what is provisioned, and makes nothing.
func TestMaxProvisionedBytes(t *testing.T) {
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		inst, _, ctx, _ := controller(t, c, rbd.Config{MaxProvisionedBytes: 100 * MiB})
		mustCreate(t, ctx, inst, blockVolume("pvc-a", 64*MiB, nil))
		before := everything(t, ctx, c)
		_, err := inst.Store.Create(ctx, blockVolume("pvc-b", 64*MiB, nil))
		testutil.WantKind(t, err, errdefs.ErrExhausted, "67108864 of its 104857600 bytes provisioned")
		if after := everything(t, ctx, c); !slices.Equal(after, before) {
			t.Fatalf("a refused create left %v (before %v)", after, before)
		}
		capa, err := inst.Store.Capacity(ctx)
		if err != nil || capa.AvailableBytes != 36*MiB {
			t.Fatalf("Capacity = %+v, %v; want what the cap leaves", capa, err)
		}
	})
}

// TestCopiesAreCopyOnWrite: a snapshot is ready at once, a restore and a
// clone are made from it and from the volume without copying; each reads
// the data of its instant; each records its chain; a copy that asks for
// another access type or less room than its source is refused.
func TestCopiesAreCopyOnWrite(t *testing.T) {
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		inst, store, ctx, _ := controller(t, c, rbd.Config{})
		vol := mustCreate(t, ctx, inst, blockVolume("pvc-src", 32*MiB, nil))
		sum := writeData(t, ctx, c, vol.ID, 32*MiB, 1)
		snap := mustSnapshot(t, ctx, inst, "snap-1", vol.ID)
		if !snap.ReadyToUse || snap.SizeBytes != 32*MiB || snap.SourceImageID != vol.ID {
			t.Fatalf("CreateSnapshot = %+v", snap)
		}
		again := mustSnapshot(t, ctx, inst, "snap-1", vol.ID)
		if again.ID != snap.ID {
			t.Fatalf("CreateSnapshot again = %+v", again)
		}
		writeData(t, ctx, c, vol.ID, 32*MiB, 2) // the volume moves on
		restored := mustCreate(t, ctx, inst, blockVolume("pvc-restored", 48*MiB, &backend.ContentSource{SnapshotID: snap.ID}))
		if restored.CapacityBytes != 48*MiB {
			t.Fatalf("the restore has %d bytes", restored.CapacityBytes)
		}
		checkData(t, ctx, c, "the restore", restored.ID, 32*MiB, sum)
		clone := mustCreate(t, ctx, inst, blockVolume("pvc-clone", 48*MiB, &backend.ContentSource{ImageID: restored.ID}))
		checkData(t, ctx, c, "the clone of the restore", clone.ID, 32*MiB, sum)
		// The restore is cloned from the source's own snapshot while the
		// source lives: one parent, not two.
		for id, depth := range map[string]string{restored.ID: "1", clone.ID: "2"} {
			if v, err := c.direct.ImageMetadataValue(ctx, c.spec(imageOf(t, c, id)), "spindle.depth"); err != nil || v != depth {
				t.Fatalf("%s records depth %q (%v); want %s", id, v, err, depth)
			}
		}
		mount := blockVolume("pvc-wrong", 32*MiB, &backend.ContentSource{SnapshotID: snap.ID})
		mount.AccessType, mount.FsType = backend.AccessMount, "ext4"
		_, err := inst.Store.Create(ctx, mount)
		testutil.WantKind(t, err, errdefs.ErrInvalidArgument, "access type")
		_, err = inst.Store.Create(ctx, blockVolume("pvc-small", 16*MiB, &backend.ContentSource{ImageID: vol.ID}))
		testutil.WantKind(t, err, errdefs.ErrOutOfRange, "smaller than its source")
		// The snapshot's own snapshot of its source stays with it, and
		// nothing else: the clone's snapshot of the restore is gone.
		if got := userSnaps(t, ctx, c, vol.ID); !slices.Equal(got, []string{"csi-copy-" + imageOf(t, c, snap.ID)[len("csi-snap-"):]}) {
			t.Fatalf("the source keeps snapshots %v; want the CSI snapshot's alone", got)
		}
		if got := userSnaps(t, ctx, c, restored.ID); len(got) != 0 {
			t.Fatalf("the restore keeps snapshots %v", got)
		}
		// Deleted, the CSI snapshot takes its snapshot of the source along
		// (into the trash namespace, while the restore hangs from it), and
		// a second restore after the source is gone is made from the
		// snapshot image itself.
		snap2 := mustSnapshot(t, ctx, inst, "snap-2", vol.ID)
		if err := inst.Snapshots.DeleteSnapshot(ctx, snap.ID); err != nil {
			t.Fatal(err)
		}
		rbd.WaitAnswered(store)
		if got := userSnaps(t, ctx, c, vol.ID); len(got) != 1 || got[0] == "csi-copy-"+imageOf(t, c, snap.ID)[len("csi-snap-"):] {
			t.Fatalf("after DeleteSnapshot the source keeps snapshots %v; want snap-2's alone", got)
		}
		checkData(t, ctx, c, "the restore of the deleted snapshot", restored.ID, 32*MiB, sum)
		if err := inst.Store.Delete(ctx, vol.ID); err != nil {
			t.Fatal(err)
		}
		late := mustCreate(t, ctx, inst, blockVolume("pvc-late", 32*MiB, &backend.ContentSource{SnapshotID: snap2.ID}))
		if v, _ := c.direct.ImageMetadataValue(ctx, c.spec(imageOf(t, c, late.ID)), "spindle.depth"); v != "2" {
			t.Fatalf("a restore after its source was deleted records depth %q; want 2 (a clone of the snapshot image)", v)
		}
	})
}

// TestCloneDepthLimits: a copy deeper than maxCloneDepth is flattened in
// the background (and usable meanwhile); one deeper than
// hardMaxCloneDepth is refused as busy, creating nothing, while its
// source is flattened, and made once that is done. (On a real cluster the
// manager may flatten the source before the deep copy is asked for; the
// fake holds its tasks until the test runs them.)
func TestCloneDepthLimits(t *testing.T) {
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		inst, _, ctx, _ := controller(t, c, rbd.Config{MaxCloneDepth: 1, HardMaxCloneDepth: 2})
		flattened := func(id string) bool {
			info, err := c.direct.StatImage(ctx, c.spec(imageOf(t, c, id)), "")
			return err == nil && info.Parent == nil
		}
		a := mustCreate(t, ctx, inst, blockVolume("pvc-a", 8*MiB, nil))
		b := mustCreate(t, ctx, inst, blockVolume("pvc-b", 8*MiB, &backend.ContentSource{ImageID: a.ID}))
		if flattened(b.ID) {
			t.Fatalf("a clone within maxCloneDepth was flattened")
		}
		if c.fake != nil {
			c.fake.ManualTasks(true)
		}
		e := mustCreate(t, ctx, inst, blockVolume("pvc-e", 8*MiB, &backend.ContentSource{ImageID: b.ID})) // 2 deep
		before := everything(t, ctx, c)
		deep := blockVolume("pvc-deep", 8*MiB, &backend.ContentSource{ImageID: e.ID}) // 3 deep
		_, err := inst.Store.Create(ctx, deep)
		switch {
		case err != nil:
			testutil.WantKind(t, err, errdefs.ErrBusy, "hardMaxCloneDepth 2", "flattened in the background")
			// Nothing new (the manager's flatten may meanwhile have removed
			// a snapshot that waited in the trash namespace).
			for _, x := range everything(t, ctx, c) {
				if !slices.Contains(before, x) {
					t.Fatalf("a refused deep clone left %s (before %v)", x, before)
				}
			}
		case c.fake != nil:
			t.Fatalf("a clone 3 deep with hardMaxCloneDepth 2 was made while its source's flatten waited")
		}
		if c.fake != nil {
			c.fake.RunTasks()
		}
		await(t, "the manager flattens the clone beyond maxCloneDepth", func() bool { return flattened(e.ID) })
		await(t, "the deep clone is made once its source is flattened", func() bool {
			_, err := inst.Store.Create(ctx, deep)
			return err == nil
		})
	})
}

// userSnaps lists the user snapshots of a volume's image.
func userSnaps(t *testing.T, ctx context.Context, c *testCluster, id string) []string {
	t.Helper()
	snaps, err := c.direct.Snapshots(ctx, c.spec(imageOf(t, c, id)))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range snaps {
		if s.Namespace == ceph.SnapUser {
			out = append(out, s.Name)
		}
	}
	return out
}

// await polls ok for up to a minute (a manager's task on a real cluster).
func await(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestFailedCopiesLeaveNothing: a CreateSnapshot, a restore or a clone
// that fails in the middle, whatever the step, removes what it built
// before it answers, so that the sidecar's retries cannot grow the pool:
// after five failed tries the pool holds exactly what it held (by its
// listings, and by "rbd du" where data is kept), and the sixth try
// succeeds.
func TestFailedCopiesLeaveNothing(t *testing.T) {
	steps := []struct {
		name  string
		match func(cephtest.Call) bool
	}{
		{"source snapshot", func(c cephtest.Call) bool {
			return c.Op == "CreateSnapshot" && strings.HasPrefix(c.Snap, "csi-") && c.Snap != "csi-snap"
		}},
		{"clone", func(c cephtest.Call) bool { return c.Op == "CloneImage" }},
		{"source snapshot removal", func(c cephtest.Call) bool {
			return c.Op == "RemoveSnapshot" && strings.HasPrefix(c.Snap, "csi-") && c.Snap != "csi-snap"
		}},
		{"snapshot image's own snapshot", func(c cephtest.Call) bool { return c.Op == "CreateSnapshot" && c.Snap == "csi-snap" }},
		{"metadata", func(c cephtest.Call) bool {
			return c.Op == "SetImageMetadata" && strings.HasPrefix(c.Image.Name, "csi-tmp-")
		}},
		{"rename", func(c cephtest.Call) bool { return c.Op == "RenameImage" }},
	}
	kinds := []struct {
		name string
		make func(ctx context.Context, inst *backend.Instance, src *backend.Image, snap *backend.Snapshot) error
	}{
		{"snapshot", func(ctx context.Context, inst *backend.Instance, src *backend.Image, _ *backend.Snapshot) error {
			_, err := inst.Snapshots.CreateSnapshot(ctx, backend.SnapshotSpec{Name: "snapshot-retried", SourceImageID: src.ID})
			return err
		}},
		{"restore", func(ctx context.Context, inst *backend.Instance, _ *backend.Image, snap *backend.Snapshot) error {
			_, err := inst.Store.Create(ctx, blockVolume("pvc-restore-retried", 16*MiB, &backend.ContentSource{SnapshotID: snap.ID}))
			return err
		}},
		{"clone", func(ctx context.Context, inst *backend.Instance, src *backend.Image, _ *backend.Snapshot) error {
			_, err := inst.Store.Create(ctx, blockVolume("pvc-clone-retried", 16*MiB, &backend.ContentSource{ImageID: src.ID}))
			return err
		}},
	}
	injected := errors.New("injected failure")
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		for _, kind := range kinds {
			for _, step := range steps {
				if kind.name == "restore" && strings.Contains(step.name, "snapshot") {
					continue // a restore takes no snapshot
				}
				if kind.name == "snapshot" && (step.name == "source snapshot removal" || step.name == "snapshot image's own snapshot") {
					continue // the source's snapshot stays with the CSI snapshot; restores make csi-snap
				}
				if kind.name == "clone" && step.name == "snapshot image's own snapshot" {
					continue
				}
				t.Run(kind.name+" fails at "+step.name, func(t *testing.T) {
					inst, _, ctx, f := controller(t, c, rbd.Config{})
					src := mustCreate(t, ctx, inst, blockVolume("pvc-source", 16*MiB, nil))
					writeData(t, ctx, c, src.ID, 16*MiB, 3)
					snap := mustSnapshot(t, ctx, inst, "snapshot-source", src.ID)
					before := everything(t, ctx, c)
					var du int64
					if c.data != nil {
						var err error
						if du, err = c.data.PoolUsed(ctx); err != nil {
							t.Fatal(err)
						}
					}
					for try := 1; try <= 5; try++ {
						armed := true
						f.set(func(call cephtest.Call) error {
							if armed && step.match(call) {
								armed = false
								return fmt.Errorf("%s: %w", call.Op, injected)
							}
							return nil
						})
						err := kind.make(ctx, inst, src, snap)
						f.set(nil)
						if !errors.Is(err, injected) {
							t.Fatalf("try %d: %v; want the injected failure", try, err)
						}
						if now := everything(t, ctx, c); !sameSet(now, before) {
							t.Fatalf("after failed try %d the pool holds %q; before the tries it held %q", try, now, before)
						}
					}
					if c.data != nil {
						if n, err := c.data.PoolUsed(ctx); err != nil || n != du {
							t.Fatalf("rbd du after five failed tries: %d bytes (%v); before them %d", n, err, du)
						}
					}
					if err := kind.make(ctx, inst, src, snap); err != nil {
						t.Fatalf("the sixth try, with nothing injected: %v", err)
					}
				})
			}
		}
	})
}

// TestDeleteInAnyOrderLeavesNothing: a volume, its snapshot, a restore of
// the snapshot and a clone of the volume, deleted in every order that
// matters: each delete answers at once, the data of every copy stays
// readable while it lives, and when all are deleted the pool holds
// nothing, trash and snapshots in every namespace included.
func TestDeleteInAnyOrderLeavesNothing(t *testing.T) {
	orders := [][]string{
		{"volume", "snapshot", "restore", "clone"},
		{"snapshot", "volume", "clone", "restore"},
		{"restore", "clone", "snapshot", "volume"},
		{"clone", "restore", "volume", "snapshot"},
	}
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		for _, order := range orders {
			t.Run(strings.Join(order, ", "), func(t *testing.T) {
				inst, store, ctx, _ := controller(t, c, rbd.Config{})
				vol := mustCreate(t, ctx, inst, blockVolume("pvc-origin", 64*MiB, nil))
				sum := writeData(t, ctx, c, vol.ID, 64*MiB, 11)
				snap := mustSnapshot(t, ctx, inst, "snapshot-origin", vol.ID)
				restore := mustCreate(t, ctx, inst, blockVolume("pvc-restore", 64*MiB, &backend.ContentSource{SnapshotID: snap.ID}))
				clone := mustCreate(t, ctx, inst, blockVolume("pvc-clone", 64*MiB, &backend.ContentSource{ImageID: vol.ID}))
				live := map[string]string{"volume": vol.ID, "restore": restore.ID, "clone": clone.ID}
				for _, what := range order {
					var err error
					if what == "snapshot" {
						err = inst.Snapshots.DeleteSnapshot(ctx, snap.ID)
					} else {
						err = inst.Store.Delete(ctx, live[what])
						delete(live, what)
					}
					if err != nil {
						t.Fatalf("delete the %s: %v", what, err)
					}
					if _, err := store.Maintain(ctx); err != nil {
						t.Fatal(err)
					}
					for name, id := range live {
						checkData(t, ctx, c, "after deleting the "+what+", the "+name, id, 64*MiB, sum)
					}
				}
				settle(t, ctx, c, store)
			})
		}
	})
}

// TestEarlierVersionsObjects: a snapshot and a clone made the way earlier
// versions made them (a full copy carrying a protected csi-snap; a clone
// of format 1 hanging from a protected csi-clone- snapshot of its source)
// keep working: the snapshot is read and restored, and everything is
// deleted, the protected snapshots included, leaving nothing.
func TestEarlierVersionsObjects(t *testing.T) {
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		inst, store, ctx, _ := controller(t, c, rbd.Config{})
		vol := mustCreate(t, ctx, inst, blockVolume("pvc-old", 16*MiB, nil))
		image := c.spec(imageOf(t, c, vol.ID))
		sum := writeData(t, ctx, c, vol.ID, 16*MiB, 5)
		must := func(err error, what string) {
			t.Helper()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
		// The old CreateSnapshot: a full copy of a csi-copy- snapshot,
		// csi-snap protected, the metadata as it wrote it.
		snapID := store.SnapshotID("snapshot-old")
		snapImage := c.spec(imageOf(t, c, snapID))
		copySnap := "csi-copy-" + strings.TrimPrefix(snapImage.Name, "csi-snap-")
		must(c.direct.CreateSnapshot(ctx, image, copySnap), "snapshot the source")
		must(c.copyImage(ctx, image, copySnap, snapImage), "copy it")
		must(c.direct.RemoveSnapshot(ctx, image, copySnap), "remove the copy snapshot")
		must(c.direct.CreateSnapshot(ctx, snapImage, "csi-snap"), "csi-snap")
		must(c.admin.Protect(ctx, snapImage, "csi-snap"), "protect csi-snap")
		must(c.direct.SetImageMetadata(ctx, snapImage, map[string]string{"spindle.volume": "", "spindle.name": "snapshot-old",
			"spindle.snapshot": fmt.Sprintf(`{"sourceImageID":%q,"sizeBytes":%d,"createdAt":"2026-01-02T03:04:05Z","accessType":"block","formatted":false}`, vol.ID, 16*MiB)}), "the old snapshot's metadata")
		// The old clone: format 1 from a protected csi-clone- snapshot.
		cloneID := store.ImageID("pvc-old-clone")
		cloneImage := c.spec(imageOf(t, c, cloneID))
		cloneSnap := "csi-clone-" + strings.TrimPrefix(cloneImage.Name, "csi-vol-")
		must(c.direct.CreateSnapshot(ctx, image, cloneSnap), "the clone snapshot")
		must(c.admin.Protect(ctx, image, cloneSnap), "protect it")
		must(c.admin.CloneV1(ctx, image, cloneSnap, cloneImage), "clone of format 1")
		must(c.direct.SetImageMetadata(ctx, cloneImage, map[string]string{"spindle.name": "pvc-old-clone",
			"spindle.volume": fmt.Sprintf(`{"accessType":"block","source":{"ImageID":%q},"createdAt":"2026-01-02T03:04:05Z"}`, vol.ID)}), "the old clone's metadata")

		got, err := inst.Snapshots.GetSnapshot(ctx, snapID)
		if err != nil || got.Name != "snapshot-old" || got.SourceImageID != vol.ID || !got.ReadyToUse {
			t.Fatalf("GetSnapshot of an old snapshot = %+v, %v", got, err)
		}
		restored := mustCreate(t, ctx, inst, blockVolume("pvc-from-old", 16*MiB, &backend.ContentSource{SnapshotID: snapID}))
		checkData(t, ctx, c, "the restore of the old snapshot", restored.ID, 16*MiB, sum)
		checkData(t, ctx, c, "the old clone", cloneID, 16*MiB, sum)

		// The old snapshot's protected csi-snap has a clone (format 2, but
		// Spindle finds the protection): the delete is refused (ABORTED,
		// retried by the sidecar) while the restore is flattened in the
		// background, then goes through.
		await(t, "DeleteSnapshot of an old snapshot with a restore", func() bool {
			err := inst.Snapshots.DeleteSnapshot(ctx, snapID)
			if err != nil && !strings.Contains(err.Error(), "flattened in the background") {
				t.Fatalf("DeleteSnapshot of an old snapshot with a restore: %v", err)
			}
			return err == nil
		})
		checkData(t, ctx, c, "the restore of the deleted old snapshot", restored.ID, 16*MiB, sum)
		// The old clone first, then its source: the protected csi-clone-
		// snapshot goes once the clone is gone.
		for _, id := range []string{cloneID, restored.ID} {
			if err := inst.Store.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		await(t, "Delete of the old clone's source", func() bool {
			if _, err := store.Maintain(ctx); err != nil {
				t.Logf("maintain: %v", err)
			}
			return inst.Store.Delete(ctx, vol.ID) == nil
		})
		settle(t, ctx, c, store)
	})
}

// TestNamePrefixesLeaveNothing: a volume of a volumeNamePrefix and its
// snapshot of a snapshotNamePrefix go to the trash under names that are
// not Spindle's own prefixes, with clones hanging from them; deleted in the
// order that leaves both waiting in the trash, nothing is left once all
// are gone. An image somebody else moved to the trash stays there.
func TestNamePrefixesLeaveNothing(t *testing.T) {
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		inst, store, ctx, _ := controller(t, c, rbd.Config{})
		foreign := c.spec("backup-of-something")
		if err := c.direct.CreateImage(ctx, foreign, 4*uint64(MiB), ceph.ImageOptions{Features: []string{"layering"}}); err != nil {
			t.Fatal(err)
		}
		if err := c.direct.TrashMove(ctx, foreign); err != nil {
			t.Fatal(err)
		}
		spec := blockVolume("pvc-prefixed", 32*MiB, nil)
		spec.Parameters = map[string]string{"volumeNamePrefix": "pg-"}
		vol := mustCreate(t, ctx, inst, spec)
		if image := imageOf(t, c, vol.ID); !strings.HasPrefix(image, "pg-") {
			t.Fatalf("the volume's image is %s, want a pg- name", image)
		}
		sum := writeData(t, ctx, c, vol.ID, 32*MiB, 3)
		snap, err := inst.Snapshots.CreateSnapshot(ctx, backend.SnapshotSpec{Name: "snapshot-prefixed", SourceImageID: vol.ID, Parameters: map[string]string{"snapshotNamePrefix": "pgsnap-"}})
		if err != nil {
			t.Fatal(err)
		}
		if image := imageOf(t, c, snap.ID); !strings.HasPrefix(image, "pgsnap-") {
			t.Fatalf("the snapshot's image is %s, want a pgsnap- name", image)
		}
		restore := mustCreate(t, ctx, inst, blockVolume("pvc-prefixed-restore", 32*MiB, &backend.ContentSource{SnapshotID: snap.ID}))
		// The volume while its snapshot lives, the snapshot while its
		// restore lives: both wait in the trash, as pg- and pgsnap- names.
		if err := inst.Store.Delete(ctx, vol.ID); err != nil {
			t.Fatal(err)
		}
		if err := inst.Snapshots.DeleteSnapshot(ctx, snap.ID); err != nil {
			t.Fatal(err)
		}
		checkData(t, ctx, c, "the restore", restore.ID, 32*MiB, sum)
		if err := inst.Store.Delete(ctx, restore.ID); err != nil {
			t.Fatal(err)
		}
		settle(t, ctx, c, store, "trash:"+foreign.Name)
		if trash, err := c.direct.Trash(ctx, ceph.PoolSpec{Pool: c.pool}); err == nil {
			for _, e := range trash {
				if e.Name == foreign.Name {
					_ = c.direct.TrashRemove(ctx, ceph.PoolSpec{Pool: c.pool}, e.ID)
				}
			}
		}
	})
}

// TestSweepRemovesCrashLeftovers: a controller that died in the middle of
// a CreateVolume or CreateSnapshot left a temporary image (one with the
// protected snapshot a snapshot image gets) and a copy snapshot on a
// volume. Opening the store in a controller (Sweep) removes those older
// than rbd.LeftoverAge and keeps fresh ones, which may belong to a Create
// still running in another controller, and everything that is not a
// leftover.
func TestSweepRemovesCrashLeftovers(t *testing.T) {
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		inst, store, ctx, _ := controller(t, c, rbd.Config{})
		vol := mustCreate(t, ctx, inst, blockVolume("pvc-swept", 16*MiB, nil))
		image := c.spec(imageOf(t, c, vol.ID))
		create := func(name string) ceph.ImageSpec {
			t.Helper()
			s := c.spec(name)
			if err := c.direct.CreateImage(ctx, s, 4*uint64(MiB), ceph.ImageOptions{Features: []string{"layering"}}); err != nil {
				t.Fatal(err)
			}
			return s
		}
		snapshot := func(s ceph.ImageSpec, snap string) {
			t.Helper()
			if err := c.direct.CreateSnapshot(ctx, s, snap); err != nil {
				t.Fatal(err)
			}
		}
		// The leftovers of a crash, old by the time the controller restarts.
		oldTmp, oldSnapTmp := create("csi-tmp-0123456789abcdef-00000001"), create("csi-tmp-fedcba9876543210-00000002")
		snapshot(oldSnapTmp, "csi-snap")
		if err := c.admin.Protect(ctx, oldSnapTmp, "csi-snap"); err != nil {
			t.Fatal(err)
		}
		oldCopy := "csi-copy-0123456789abcdef0123456789abcdef"
		snapshot(image, oldCopy)
		var newest time.Time
		for _, s := range []ceph.ImageSpec{oldTmp, oldSnapTmp} {
			info, err := c.direct.StatImage(ctx, s, "")
			if err != nil {
				t.Fatal(err)
			}
			if info.Created.After(newest) {
				newest = info.Created
			}
		}
		snaps, _ := c.direct.Snapshots(ctx, image)
		for _, s := range snaps {
			if s.Created.After(newest) {
				newest = s.Created
			}
		}
		// Images and snapshots the sweep must keep: not Spindle's, or not
		// leftovers, or leftovers younger than LeftoverAge.
		time.Sleep(time.Until(newest.Add(1100 * time.Millisecond)))
		freshTmp := create("csi-tmp-00000000000000aa-00000003")
		freshCopy := "csi-copy-aa000000000000000000000000000000"
		snapshot(image, freshCopy)
		notSpindles := create("not-spindles")
		snapshot(image, "operator-backup")

		// Ten minutes after the newest old leftover.
		rbd.SetClock(inst, func() time.Time { return newest.Add(rbd.LeftoverAge) })
		removed, err := store.Sweep(ctx)
		if err != nil {
			t.Fatalf("sweep: %v (removed %v)", err, removed)
		}
		want := []string{oldTmp.String(), oldSnapTmp.String(), image.At(oldCopy)}
		if !sameSet(removed, want) {
			t.Fatalf("sweep removed %v; want %v", removed, want)
		}
		keep := []string{image.Name, image.Name + "@" + freshCopy, image.Name + "@operator-backup", freshTmp.Name, notSpindles.Name}
		if got := everything(t, ctx, c); !sameSet(got, keep) {
			t.Fatalf("after the sweep the pool holds %v; want %v", got, keep)
		}
		if img, err := inst.Store.Get(ctx, vol.ID); err != nil || img.Name != "pvc-swept" {
			t.Fatalf("volume after the sweep: %+v, %v", img, err)
		}
		if again, err := store.Sweep(ctx); err != nil || len(again) != 0 {
			t.Fatalf("second sweep: removed %v, %v; want nothing", again, err)
		}
		// What the test made itself goes.
		_ = c.direct.RemoveSnapshot(ctx, image, freshCopy)
		_ = c.direct.RemoveSnapshot(ctx, image, "operator-backup")
		for _, s := range []ceph.ImageSpec{freshTmp, notSpindles} {
			_ = c.direct.RemoveImage(ctx, s)
		}
	})
}

// TestErrorOfNoKindIsNotExistence: an error of no kind while looking for
// an existing volume or snapshot (the cluster does not answer within the
// call's limit) is that error, never "it exists" nor "it does not":
// Create and CreateSnapshot answer it and build nothing.
func TestErrorOfNoKindIsNotExistence(t *testing.T) {
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		inst, store, ctx, f := controller(t, c, rbd.Config{})
		src := mustCreate(t, ctx, inst, blockVolume("pvc-src", 8*MiB, nil))
		before := everything(t, ctx, c)
		f.set(func(call cephtest.Call) error {
			switch call.Op {
			case "DescribeImage", "ImageHeader", "ImageMetadata", "InspectImage":
				return &ceph.DeadlineError{Op: call.Op + " " + call.Image.String(), Limit: 30 * time.Second}
			}
			return nil
		})
		var de *ceph.DeadlineError
		for _, spec := range []backend.VolumeSpec{
			blockVolume("pvc-src", 8*MiB, nil), // exists: Ceph refuses to make it again, and reading it fails
			blockVolume("pvc-1", 8*MiB, &backend.ContentSource{ImageID: src.ID}),
		} {
			_, err := inst.Store.Create(ctx, spec)
			if !errors.As(err, &de) || errdefs.KindOf(err) != nil {
				t.Fatalf("Create %s while the cluster does not answer = %v; want the deadline, of no kind", spec.Name, err)
			}
		}
		_, err := inst.Snapshots.CreateSnapshot(ctx, backend.SnapshotSpec{Name: "snap-1", SourceImageID: src.ID})
		if !errors.As(err, &de) {
			t.Fatalf("CreateSnapshot while the cluster does not answer = %v; want the deadline", err)
		}
		f.set(nil)
		if after := everything(t, ctx, c); !sameSet(after, before) {
			t.Fatalf("the pool holds %v after the failed calls; before %v", after, before)
		}
		_ = store
	})
}

// TestRecordFormattedIsOneCall: the node records a volume's filesystem
// with one call to the cluster (each call cost seconds on a loaded node).
func TestRecordFormattedIsOneCall(t *testing.T) {
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		inst, store, ctx, f := controller(t, c, rbd.Config{})
		img := mustCreate(t, ctx, inst, backend.VolumeSpec{Name: "pvc-1", CapacityBytes: 8 * MiB, AccessType: backend.AccessMount, FsType: "ext4"})
		f.reset()
		if err := store.RecordFormatted(ctx, img.ID, "ext4"); err != nil {
			t.Fatal(err)
		}
		if calls := f.calls(); len(calls) != 1 || calls[0].Op != "SetImageMetadata" {
			t.Fatalf("RecordFormatted made calls %+v; want one SetImageMetadata", calls)
		}
		if got, err := inst.Store.Get(ctx, img.ID); err != nil || !got.Formatted || got.FsType != "ext4" {
			t.Fatalf("after RecordFormatted: %+v, %v", got, err)
		}
	})
}

// TestFenceWaitsForTheWatchToGo: with fencing, the publish to the new node
// of a volume no node holds but that a lost node's client still has open
// blocklists that client (never the Ceph manager's), then waits until the
// OSDs have dropped its watch before it records the attachment, so the
// new node's watcher check passes. Without fencing, the new node's stage
// is refused naming the watcher.
func TestFenceWaitsForTheWatchToGo(t *testing.T) {
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		inst, _, ctx, _ := controller(t, c, rbd.Config{Fencing: true})
		img := mustCreate(t, ctx, inst, blockVolume("pvc-1", 8*MiB, nil))
		addr, stop, err := c.admin.Watch(ctx, c.spec(imageOf(t, c, img.ID)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		if c.fake != nil {
			// The manager had the image open that moment for a task of its
			// own: it is no node, and never fenced.
			unwatch, err := c.fake.Watch(c.spec(imageOf(t, c, img.ID)), cephfake.ManagerAddr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(unwatch)
		}
		if _, err := inst.Exporter.Publish(ctx, img.ID, backend.Attachment{NodeID: "node-b", AccessMode: backend.SingleNodeWriter}); err != nil {
			t.Fatalf("Publish with fencing: %v", err)
		}
		if w, err := c.direct.Watchers(ctx, c.spec(imageOf(t, c, img.ID))); err != nil || slices.Contains(w, addr) {
			t.Fatalf("after the fenced publish the image is watched by %v (%v); %s was to be fenced", w, err, addr)
		}
		if c.fake != nil {
			if got := c.fake.Blocklisted(); !slices.Equal(got, []string{addr}) {
				t.Fatalf("blocklisted %v; want only %s", got, addr)
			}
		}
	})
}

// TestAdoptImageInPlace: an image made as ceph-csi makes one (no Spindle
// metadata; its PV names it in volumeAttributes imageName) becomes a
// Spindle volume in place: while a client has it open the dry run says by
// whom and the adoption is refused; the dry run writes nothing; an
// adoption that stopped half-written is finished; adopting again is
// idempotent and under another name refused; its features are checked
// against the class's mounter (journaling: not for krbd); an image
// ceph-csi encrypted is refused, nothing written; and the adopted volume
// is snapshotted and restored as any other.
func TestAdoptImageInPlace(t *testing.T) {
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		inst, s, ctx, _ := controller(t, c, rbd.Config{})
		image := c.spec("csi-vol-6b9ffd6d-4f49-4ea2-9e5b-2bb2e3f9fb4a")
		if err := c.direct.CreateImage(ctx, image, 256*uint64(MiB), ceph.ImageOptions{Features: []string{"layering"}}); err != nil {
			t.Fatal(err)
		}
		attrs := map[string]string{"clusterID": "test", "pool": c.pool, "imageName": image.Name, "imageFeatures": "layering", "journalPool": c.pool}
		id, err := s.StaticImage("0001-0004-test-0000000000000001-6b9ffd6d-4f49-4ea2-9e5b-2bb2e3f9fb4a", attrs)
		if err != nil {
			t.Fatal(err)
		}
		sum := writeData(t, ctx, c, id, 64*MiB, 30)
		spec := backend.AdoptSpec{ImageID: id, Name: "pvc-4711", AccessType: backend.AccessMount, FsType: "ext4",
			Parameters: map[string]string{"clusterID": "test", "pool": c.pool, "imageFeatures": "layering"}, DryRun: true}

		addr, stop, err := c.admin.Watch(ctx, image)
		if err != nil {
			t.Fatal(err)
		}
		dry, err := s.Adopt(ctx, spec)
		if err != nil || !slices.Equal(dry.OpenBy, []string{addr}) || dry.Image.Name != "pvc-4711" || dry.Image.CapacityBytes != 256*MiB {
			stop()
			t.Fatalf("dry run while %s has the image open = %+v, %v", addr, dry, err)
		}
		real := spec
		real.DryRun = false
		_, err = s.Adopt(ctx, real)
		testutil.WantKind(t, err, errdefs.ErrPrecondition, "still open by ["+addr+"]", "nothing was changed")
		stop()
		await(t, "the watch ends", func() bool {
			w, err := c.direct.Watchers(ctx, image)
			return err == nil && len(w) == 0
		})
		if meta, err := c.direct.ImageMetadata(ctx, image); err != nil || len(meta) != 0 {
			t.Fatalf("after the dry run and the refusal the image has metadata %v (%v)", meta, err)
		}
		// An adoption that stopped between its two writes (the name
		// written, the volume record not) is finished by the next one.
		if err := c.direct.SetImageMetadata(ctx, image, map[string]string{"spindle.name": "pvc-4711"}); err != nil {
			t.Fatal(err)
		}
		adopted, err := s.Adopt(ctx, real)
		if err != nil {
			t.Fatalf("Adopt: %v", err)
		}
		got, err := inst.Store.Get(ctx, id)
		if err != nil || got.Name != "pvc-4711" || got.AccessType != backend.AccessMount || got.FsType != "ext4" || got.CapacityBytes != 256*MiB || got.Formatted {
			t.Fatalf("the adopted volume reads back as %+v, %v", got, err)
		}
		checkData(t, ctx, c, "the adopted image", id, 64*MiB, sum)
		if again, err := s.Adopt(ctx, real); err != nil || again.Image.ID != adopted.Image.ID {
			t.Fatalf("adopting again = %+v, %v", again, err)
		}
		other := real
		other.Name = "pvc-other"
		_, err = s.Adopt(ctx, other)
		testutil.WantKind(t, err, errdefs.ErrPrecondition, "pvc-4711")
		snap := mustSnapshot(t, ctx, inst, "snap-adopted", id)
		restored := mustCreate(t, ctx, inst, backend.VolumeSpec{Name: "pvc-restored", CapacityBytes: 256 * MiB, AccessType: backend.AccessMount, FsType: "ext4",
			Source: &backend.ContentSource{SnapshotID: snap.ID}})
		checkData(t, ctx, c, "the restore of the adopted volume's snapshot", restored.ID, 64*MiB, sum)

		// Journaling: krbd cannot map it; refused, dry run or not, before
		// anything is written; taken for rbd-nbd.
		journaled := c.spec("csi-vol-0d5c7a3e-journaled")
		if err := c.direct.CreateImage(ctx, journaled, 64*uint64(MiB), ceph.ImageOptions{Features: []string{"layering", "exclusive-lock", "journaling"}}); err != nil {
			t.Fatal(err)
		}
		jid, _ := s.StaticImage("0001-0004-test-0000000000000001-0d5c7a3e", map[string]string{"clusterID": "test", "pool": c.pool, "imageName": journaled.Name})
		jspec := backend.AdoptSpec{ImageID: jid, Name: "pvc-journaled", AccessType: backend.AccessMount, FsType: "ext4",
			Parameters: map[string]string{"clusterID": "test", "pool": c.pool, "mounter": "krbd"}}
		for _, dryRun := range []bool{true, false} {
			jspec.DryRun = dryRun
			_, err := s.Adopt(ctx, jspec)
			testutil.WantKind(t, err, errdefs.ErrPrecondition, "journaling", "krbd", "rbd-nbd")
		}
		if meta, _ := c.direct.ImageMetadata(ctx, journaled); len(meta) != 0 {
			t.Fatalf("the refused journaled image has metadata %v", meta)
		}
		jspec.DryRun, jspec.Parameters["mounter"] = false, "rbd-nbd"
		if got, err := s.Adopt(ctx, jspec); err != nil || got.Image.Name != "pvc-journaled" {
			t.Fatalf("adopting it into a class of rbd-nbd = %+v, %v", got, err)
		}

		// What ceph-csi leaves on an image it encrypted, in its current
		// and its earlier spellings: refused, nothing written, the wrapped
		// data key never in the message.
		for i, meta := range []map[string]string{
			{"rbd.csi.ceph.com/encrypted": "encrypted", "csi.storage.k8s.io/pvc/name": "data"},
			{"rbd.csi.ceph.com/encrypted": "encryptionPrepared"},
			{".rbd.csi.ceph.com/encrypted": "encrypted"},
			{"rbd.csi.ceph.com/dek": `{"dek":"c2VjcmV0","nonce":"abcd"}`},
		} {
			enc := c.spec(fmt.Sprintf("csi-vol-0c1d5e55-encrypted-%d", i))
			if err := c.direct.CreateImage(ctx, enc, 64*uint64(MiB), ceph.ImageOptions{Features: []string{"layering"}}); err != nil {
				t.Fatal(err)
			}
			if err := c.direct.SetImageMetadata(ctx, enc, meta); err != nil {
				t.Fatal(err)
			}
			encID, _ := s.StaticImage(fmt.Sprintf("0001-0004-test-0000000000000001-0c1d5e55-%d", i), map[string]string{"clusterID": "test", "pool": c.pool, "imageName": enc.Name})
			encSpec := real
			encSpec.ImageID, encSpec.Name = encID, "pvc-encrypted"
			_, err := s.Adopt(ctx, encSpec)
			testutil.WantKind(t, err, errdefs.ErrPrecondition, "ceph-csi encrypted this image")
			if strings.Contains(err.Error(), "c2VjcmV0") {
				t.Fatalf("the refusal carries the wrapped data key: %v", err)
			}
			if got, _ := c.direct.ImageMetadata(ctx, enc); len(got) != len(meta) {
				t.Fatalf("the refused image's metadata: %v; want only ceph-csi's %v", got, meta)
			}
		}
	})
}

// TestSetEncryption: key rotation rewrites an encrypted volume's record in
// place, on a volume created with the driver's encryption keys among its
// parameters (the store reads past them).
func TestSetEncryption(t *testing.T) {
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		inst, _, ctx, _ := controller(t, c, rbd.Config{})
		enc := &backend.Encryption{KMSID: "secrets", KeyOwner: "volume/pvc-enc", WrappedKey: "wrapped-1"}
		img := mustCreate(t, ctx, inst, backend.VolumeSpec{Name: "pvc-enc", CapacityBytes: 64 * MiB, AccessType: backend.AccessBlock, Encryption: enc,
			Parameters: map[string]string{"pool": c.pool, "encrypted": "true", "encryptionKMSID": "secrets"}})
		keeper := inst.Store.(backend.EncryptionKeeper)
		next := enc.Clone()
		next.NextWrappedKey = "wrapped-2"
		if err := keeper.SetEncryption(ctx, img.ID, next); err != nil {
			t.Fatalf("SetEncryption: %v", err)
		}
		got, err := inst.Store.Get(ctx, img.ID)
		if err != nil || got.Encryption == nil || got.Encryption.WrappedKey != "wrapped-1" || got.Encryption.NextWrappedKey != "wrapped-2" || got.Name != "pvc-enc" || got.Parameters["encrypted"] != "true" {
			t.Fatalf("after SetEncryption: %+v, %v", got, err)
		}
		err = keeper.SetEncryption(ctx, c.pool+"/csi-vol-00000000000000000000000000000000", next)
		testutil.WantKind(t, err, errdefs.ErrNotFound, "does not exist")
	})
}

// TestNodeRegistryAndLocations: node plugins register in the pool's omap
// and the controller reads them (an unknown node: not found); the
// locations a controller made images in are recorded in its own pool, so
// that a restarted controller lists and maintains them.
func TestNodeRegistryAndLocations(t *testing.T) {
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		inst, _, ctx, _ := controller(t, c, rbd.Config{NodeRegistry: true})
		if err := inst.Attacher.RegisterNode(ctx, backend.NodeInfo{NodeID: "node-1", MaxVolumesPerNode: 3}); err != nil {
			t.Fatal(err)
		}
		img := mustCreate(t, ctx, inst, backend.VolumeSpec{Name: "pvc-ns", CapacityBytes: 8 * MiB, AccessType: backend.AccessBlock,
			Parameters: map[string]string{rbd.ParamRadosNamespace: cephtest.Namespace}})
		// A second controller process, on the same cluster.
		inst2, _, _, _ := controller(t, c, rbd.Config{NodeRegistry: true}, keep)
		_, err := inst2.Exporter.Publish(ctx, img.ID, backend.Attachment{NodeID: "node-9", AccessMode: backend.SingleNodeWriter})
		testutil.WantKind(t, err, errdefs.ErrNotFound, `node "node-9" is not registered`)
		if _, err := inst2.Exporter.Publish(ctx, img.ID, backend.Attachment{NodeID: "node-1", AccessMode: backend.SingleNodeWriter}); err != nil {
			t.Fatalf("Publish to a registered node: %v", err)
		}
		list, err := inst2.Store.List(context.WithoutCancel(ctx))
		if err != nil || len(list) != 1 || list[0].ID != img.ID {
			t.Fatalf("a restarted controller lists %+v (%v); want the volume in namespace %s", list, err, cephtest.Namespace)
		}
		_ = inst2.Exporter.Unpublish(ctx, img.ID, "node-1")
		if err := inst2.Store.Delete(ctx, img.ID); err != nil {
			t.Fatal(err)
		}
	})
}

// TestCreatesCutShort: a volume of no source is made in place; one whose
// create was cut short between the image and its record (the controller
// died, or the cluster stopped answering and the image could not be
// removed) is made again by the repeated CreateVolume, and removed by
// Sweep once its note is older than LeftoverAge when nobody repeats it.
// An image of the volume's name carrying another object's metadata is
// never touched.
func TestCreatesCutShort(t *testing.T) {
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		inst, store, ctx, f := controller(t, c, rbd.Config{})
		stuck := func(call cephtest.Call) error {
			if call.Op == "SetImageMetadata" || call.Op == "RemoveImage" {
				return &ceph.DeadlineError{Op: call.Op, Limit: 30 * time.Second}
			}
			return nil
		}
		// cutShort makes a create of name cut short; prefix is its
		// volumeNamePrefix ("" for none).
		cutShort := func(name, prefix string) string {
			t.Helper()
			f.set(stuck)
			defer f.set(nil)
			spec := blockVolume(name, 8*MiB, nil)
			image := imageOf(t, c, store.ImageID(name))
			if prefix != "" {
				spec.Parameters = map[string]string{rbd.ParamVolumeNamePrefix: prefix}
				image = prefix + strings.TrimPrefix(image, "csi-vol-")
			}
			if img, err := inst.Store.Create(ctx, spec); err == nil {
				t.Fatalf("Create %s with the metadata call failing = %+v", name, img)
			}
			if got := everything(t, ctx, c); !slices.Contains(got, image) {
				t.Fatalf("after a create cut short the pool holds %v; want %s", got, image)
			}
			// An image of a volumeNamePrefix is noted: its name does not
			// say it is Spindle's.
			notes, err := c.direct.OmapKeys(ctx, ceph.PoolSpec{Pool: c.pool}, "spindle.creates")
			if err != nil || slices.Contains(notes, image) != (prefix != "") {
				t.Fatalf("the notes of creates after one cut short: %v, %v; want %s noted only if it has a volumeNamePrefix", notes, err, image)
			}
			return image
		}

		image := cutShort("pvc-repeated", "")
		img, err := inst.Store.Create(ctx, blockVolume("pvc-repeated", 8*MiB, nil))
		if err != nil || img.Name != "pvc-repeated" || img.CapacityBytes != 8*MiB {
			t.Fatalf("repeated Create = %+v, %v", img, err)
		}
		if got, err := inst.Store.Get(ctx, img.ID); err != nil || got.Name != "pvc-repeated" {
			t.Fatalf("Get after the repeated Create = %+v, %v", got, err)
		}
		if got := everything(t, ctx, c); !sameSet(got, []string{image}) {
			t.Fatalf("after the repeated Create the pool holds %v; want the volume alone", got)
		}

		// Another object's image under the name: refused, and kept.
		other := c.spec(imageOf(t, c, store.ImageID("pvc-taken")))
		if err := c.direct.CreateImage(ctx, other, 4*uint64(MiB), ceph.ImageOptions{Features: []string{"layering"}}); err != nil {
			t.Fatal(err)
		}
		if err := c.direct.SetImageMetadata(ctx, other, map[string]string{"spindle.name": "pvc-someone-else"}); err != nil {
			t.Fatal(err)
		}
		if _, err := inst.Store.Create(ctx, blockVolume("pvc-taken", 8*MiB, nil)); errdefs.KindOf(err) != errdefs.ErrAlreadyExists {
			t.Fatalf("Create over another object's image = %v; want ALREADY_EXISTS", err)
		}
		if meta, err := c.direct.ImageMetadata(ctx, other); err != nil || meta["spindle.name"] != "pvc-someone-else" {
			t.Fatalf("the other object's image after the refused Create: %v, %v", meta, err)
		}

		// Nobody repeats it: Sweep removes it, but not before LeftoverAge.
		abandoned, prefixed := cutShort("pvc-abandoned", ""), cutShort("pvc-abandoned-too", "db-")
		if removed, err := store.Sweep(ctx); err != nil || len(removed) != 0 {
			t.Fatalf("sweep at once removed %v, %v; want nothing (the creates may still run)", removed, err)
		}
		rbd.SetClock(inst, func() time.Time { return time.Now().Add(rbd.LeftoverAge + time.Minute) })
		removed, err := store.Sweep(ctx)
		if want := []string{c.spec(abandoned).String(), c.spec(prefixed).String()}; err != nil || !sameSet(removed, want) {
			t.Fatalf("sweep removed %v, %v; want %v", removed, err, want)
		}
		if got, want := everything(t, ctx, c), []string{image, other.Name}; !sameSet(got, want) {
			t.Fatalf("after the sweep the pool holds %v; want %v", got, want)
		}
		if notes, err := c.direct.OmapKeys(ctx, ceph.PoolSpec{Pool: c.pool}, "spindle.creates"); err != nil || len(notes) != 0 {
			t.Fatalf("the notes of creates after the sweep: %v, %v; want none", notes, err)
		}
		_ = c.direct.RemoveImage(ctx, other)
	})
}

// TestDeleteWaitsForItsOwnWork: DeleteSnapshot drops the source's
// csi-copy snapshot after its answer, which opens the source (on Ceph, a
// watcher). A Delete of the source that comes at that moment, as the
// sidecars and csi-sanity send it, waits for that work instead of taking
// the driver's own watcher for a node's mapping and refusing.
func TestDeleteWaitsForItsOwnWork(t *testing.T) {
	forEachCluster(t, func(t *testing.T, c *testCluster) {
		inst, store, ctx, f := controller(t, c, rbd.Config{})
		src := mustCreate(t, ctx, inst, blockVolume("pvc-source", 8*MiB, nil))
		snap := mustSnapshot(t, ctx, inst, "snapshot-source", src.ID)
		srcImage := imageOf(t, c, src.ID)

		var mu sync.Mutex
		var order []string
		note := func(s string) {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, s)
		}
		release := make(chan struct{})
		f.holdCalls(func(call cephtest.Call) {
			switch {
			case call.Op == "RemoveSnapshot" && call.Image.Name == srcImage && strings.HasPrefix(call.Snap, "csi-copy-"):
				<-release
				note("source's copy snapshot removed")
			case call.Op == "InspectImage" && call.Image.Name == srcImage:
				note("source inspected for deletion")
			}
		})
		t.Cleanup(func() { f.holdCalls(nil) })
		if err := inst.Snapshots.DeleteSnapshot(ctx, snap.ID); err != nil {
			t.Fatal(err)
		}
		deleted := make(chan error, 1)
		go func() { deleted <- inst.Store.Delete(ctx, src.ID) }()
		// Give a Delete that did not wait the time to inspect the source.
		time.Sleep(100 * time.Millisecond)
		close(release)
		if err := <-deleted; err != nil {
			t.Fatalf("Delete of the source while the driver dropped its snapshot: %v", err)
		}
		settle(t, ctx, c, store)
		mu.Lock()
		defer mu.Unlock()
		if want := []string{"source's copy snapshot removed", "source inspected for deletion"}; !slices.Equal(order, want) {
			t.Fatalf("order of calls %q; want %q", order, want)
		}
	})
}
