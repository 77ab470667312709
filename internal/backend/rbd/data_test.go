package rbd_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/rbd"
	"github.com/spindle-csi/spindle/internal/backend/rbd/rbdtest"
	"github.com/spindle-csi/spindle/internal/command"
)

const (
	MiB = int64(1) << 20
	GiB = int64(1) << 30
)

// controller is an instance as the controller sees it (its own identity
// for Maintain), on a runner of the test's choosing; the pool is emptied
// before and after the test.
func controller(t *testing.T, cl *rbdtest.Cluster, cfg rbd.Config, e utilexec.Interface) (*backend.Instance, *rbd.Store, context.Context) {
	t.Helper()
	wipe := func() {
		if err := cl.Wipe(context.Background()); err != nil {
			t.Fatalf("empty pool %s: %v", cl.Pool, err)
		}
	}
	wipe()
	t.Cleanup(wipe)
	cfg.ClusterID, cfg.Monitors, cfg.Pool = "test", []string{cl.Monitor}, cl.Pool
	cfg.Mounter, cfg.UserID, cfg.KeyFile = rbd.MounterFuse, cl.User, cl.KeyFile
	if e == nil {
		e = utilexec.New()
	}
	inst, err := rbd.New("test", cfg, command.New(e, nil))
	if err != nil {
		t.Fatal(err)
	}
	return inst, inst.Store.(*rbd.Store), backend.WithSecrets(t.Context(), cl.Secrets())
}

func blockVolume(name string, size int64, src *backend.ContentSource) backend.VolumeSpec {
	return backend.VolumeSpec{Name: name, CapacityBytes: size, AccessType: backend.AccessBlock, Source: src}
}

func mustCreate(t *testing.T, ctx context.Context, inst *backend.Instance, spec backend.VolumeSpec) *backend.Image {
	t.Helper()
	img, err := inst.Store.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create %s: %v", spec.Name, err)
	}
	return img
}

func mustSnapshot(t *testing.T, ctx context.Context, inst *backend.Instance, name, source string) *backend.Snapshot {
	t.Helper()
	snap, err := inst.Snapshots.CreateSnapshot(ctx, backend.SnapshotSpec{Name: name, SourceImageID: source})
	if err != nil {
		t.Fatalf("CreateSnapshot %s of %s: %v", name, source, err)
	}
	return snap
}

// settle runs the controller's upkeep until the pool holds exactly want
// (images, their snapshots in every namespace, the trash): the removal of
// trashed images runs in the background, in the Ceph manager.
func settle(t *testing.T, ctx context.Context, cl *rbdtest.Cluster, store *rbd.Store, want ...string) {
	t.Helper()
	slices.Sort(want)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if _, err := store.Maintain(ctx); err != nil {
			t.Logf("maintain: %v", err)
		}
		got, err := cl.Everything(ctx)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			tasks, _ := store.Tasks(ctx)
			t.Fatalf("the pool still holds %q, want %q (background tasks: %+v)", got, want, tasks)
		}
		time.Sleep(time.Second)
	}
}

// storedGrowth is how much more the pool stores now than before, by "ceph
// df". The OSD reports its statistics every few seconds, so it writes a
// probe of known size into a volume of its own and waits until ceph df
// counts it: then every change before the probe is counted too.
func storedGrowth(t *testing.T, ctx context.Context, cl *rbdtest.Cluster, inst *backend.Instance, before int64, probeName string) int64 {
	t.Helper()
	const probe = 8 * MiB
	img := mustCreate(t, ctx, inst, blockVolume(probeName, probe, nil))
	if _, err := cl.WriteRandom(ctx, imageOf(t, cl, img.ID), probe, 7); err != nil {
		t.Fatal(err)
	}
	// Allow for the pool's few bytes of RBD bookkeeping that come and go.
	n, err := cl.AwaitStored(ctx, 2*time.Minute, func(n int64) bool { return n >= before+probe-64<<10 })
	if err != nil {
		t.Fatalf("waiting for ceph df to count the %d-byte probe: %v", probe, err)
	}
	if err := inst.Store.Delete(ctx, img.ID); err != nil {
		t.Fatal(err)
	}
	return n - before - probe
}

// TestRBDSnapshotOfFullVolumeIsInstant: a volume with 2 GiB of data in it,
// as a database's would be. Its snapshot is ready at once and costs the
// pool nothing; a restore reads back every byte; the source can be deleted
// first; and once everything is deleted the pool is empty, trash included.
func TestRBDSnapshotOfFullVolumeIsInstant(t *testing.T) {
	cl := rbdtest.Require(t)
	inst, store, ctx := controller(t, cl, rbd.Config{}, nil)
	const data = 2 * GiB
	// The pool was just emptied; ceph df says so within seconds.
	empty := func(n int64) bool { return n < MiB }
	baseline, err := cl.AwaitStored(ctx, 2*time.Minute, empty)
	if err != nil {
		t.Fatal(err)
	}

	vol := mustCreate(t, ctx, inst, blockVolume("pvc-database", data, nil))
	t0 := time.Now()
	sum, err := cl.WriteRandom(ctx, imageOf(t, cl, vol.ID), data, 29)
	if err != nil {
		t.Fatal(err)
	}
	wrote := time.Since(t0)
	// The emptied pool's few bytes of RBD bookkeeping (under 1 MiB) come
	// and go; the data is what must be counted.
	before, err := cl.AwaitStored(ctx, 3*time.Minute, func(n int64) bool { return n >= data })
	if err != nil {
		t.Fatalf("ceph df never counted the %d bytes written: %v", data, err)
	}
	duBefore, err := cl.PoolUsed(ctx)
	if err != nil {
		t.Fatal(err)
	}

	t0 = time.Now()
	snap := mustSnapshot(t, ctx, inst, "snapshot-database", vol.ID)
	ready := time.Since(t0)
	if !snap.ReadyToUse || snap.SizeBytes != data {
		t.Fatalf("CreateSnapshot = %+v; want ready to use at once, of %d bytes", snap, data)
	}
	duAfter, err := cl.PoolUsed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	grew := storedGrowth(t, ctx, cl, inst, before, "pvc-probe")
	t.Logf("ceph df: the pool stored %d bytes with the data, %d more after the snapshot; rbd du: %d bytes used, then %d", before, grew, duBefore, duAfter)
	if limit := data / 100; grew > limit || duAfter-duBefore > limit {
		t.Fatalf("the snapshot of %d bytes of data grew the pool by %d bytes (ceph df) and %d (rbd du); want under 1%% (%d)", data, grew, duAfter-duBefore, limit)
	}

	t0 = time.Now()
	restored := mustCreate(t, ctx, inst, blockVolume("pvc-database-restored", data, &backend.ContentSource{SnapshotID: snap.ID}))
	restoredIn := time.Since(t0)
	if got, err := cl.Checksum(ctx, imageOf(t, cl, restored.ID), data); err != nil || got != sum {
		t.Fatalf("the restored volume reads sha256 %s (%v); the source was written with %s", got, err, sum)
	}

	// The source first: its data stays for the snapshot and the restore.
	if err := inst.Store.Delete(ctx, vol.ID); err != nil {
		t.Fatalf("Delete the source while a snapshot and a restore of it live: %v", err)
	}
	if err := inst.Snapshots.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatalf("DeleteSnapshot while a restore of it lives: %v", err)
	}
	if _, err := store.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := cl.Checksum(ctx, imageOf(t, cl, restored.ID), data); err != nil || got != sum {
		t.Fatalf("after its source and snapshot were deleted, the restored volume reads sha256 %s (%v); want %s", got, err, sum)
	}
	if err := inst.Store.Delete(ctx, restored.ID); err != nil {
		t.Fatal(err)
	}
	settle(t, ctx, cl, store)
	after, err := cl.AwaitStored(ctx, 3*time.Minute, empty)
	if err != nil {
		t.Fatalf("with everything deleted: %v (it stored %d before the test)", err, baseline)
	}
	t.Logf("%d GiB written in %s; snapshot ready in %s, restore in %s; the emptied pool stores %d bytes",
		data/GiB, wrote.Round(time.Millisecond), ready.Round(time.Millisecond), restoredIn.Round(time.Millisecond), after)
}

// failingExec runs every command as it is but, once armed, makes the
// first that matches exit 5 with "injected failure" instead.
type failingExec struct {
	utilexec.Interface
	match func(name string, args []string) bool
	mu    sync.Mutex
	armed bool
}

func (f *failingExec) arm() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed = true
}

func (f *failingExec) CommandContext(ctx context.Context, name string, args ...string) utilexec.Cmd {
	f.mu.Lock()
	fail := f.armed && f.match(name, args)
	if fail {
		f.armed = false
	}
	f.mu.Unlock()
	if fail {
		return f.Interface.CommandContext(ctx, "sh", "-c", "echo 'injected failure' >&2; exit 5")
	}
	return f.Interface.CommandContext(ctx, name, args...)
}

// argsHave reports whether args hold each of want, in order.
func argsHave(args []string, want ...string) bool {
	i := 0
	for _, a := range args {
		if i < len(want) && strings.Contains(a, want[i]) {
			i++
		}
	}
	return i == len(want)
}

// TestFailedCopiesLeaveNothing: a CreateSnapshot, a restore or a clone
// that fails in the middle, whatever the step, removes what it built
// before it answers, so that the sidecar's retries cannot grow the pool:
// after five failed tries the pool holds exactly what it held, by its
// listings and by "rbd du" and "ceph df", and the sixth try succeeds.
func TestFailedCopiesLeaveNothing(t *testing.T) {
	cl := rbdtest.Require(t)
	steps := []struct {
		name  string
		match func(name string, args []string) bool
	}{
		{"source snapshot", func(n string, a []string) bool { return n == "rbd" && argsHave(a, "snap", "create", "@csi-") }},
		{"clone", func(n string, a []string) bool { return n == "rbd" && argsHave(a, "clone") }},
		{"source snapshot removal", func(n string, a []string) bool { return n == "rbd" && argsHave(a, "snap", "rm", "@csi-") }},
		{"snapshot image's own snapshot", func(n string, a []string) bool { return n == "rbd" && argsHave(a, "snap", "create", "@csi-snap") }},
		{"metadata", func(n string, a []string) bool { return n == "rbd" && argsHave(a, "image-meta", "set", "csi-tmp-") }},
		{"rename", func(n string, a []string) bool { return n == "rbd" && argsHave(a, "rename") }},
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
	for _, kind := range kinds {
		for _, step := range steps {
			if kind.name == "restore" && strings.Contains(step.name, "snapshot") {
				continue // a restore takes no snapshot
			}
			if kind.name == "clone" && step.name == "snapshot image's own snapshot" {
				continue
			}
			t.Run(kind.name+" fails at "+step.name, func(t *testing.T) {
				inject := &failingExec{Interface: utilexec.New(), match: step.match}
				inst, _, ctx := controller(t, cl, rbd.Config{}, inject)
				src := mustCreate(t, ctx, inst, blockVolume("pvc-source", 16*MiB, nil))
				if _, err := cl.WriteRandom(ctx, imageOf(t, cl, src.ID), 16*MiB, 3); err != nil {
					t.Fatal(err)
				}
				snap := mustSnapshot(t, ctx, inst, "snapshot-source", src.ID)
				before, err := cl.Everything(ctx)
				if err != nil {
					t.Fatal(err)
				}
				du, err := cl.PoolUsed(ctx)
				if err != nil {
					t.Fatal(err)
				}
				// ceph df is checked for the snapshot (the other copies
				// fail the same way, through the same code).
				var stored int64
				// ceph df lags: wait until it counts the source's data
				// and no longer what the previous case held.
				if kind.name == "snapshot" {
					if stored, err = cl.AwaitStored(ctx, 2*time.Minute, func(n int64) bool { return n >= 16*MiB && n < 17*MiB }); err != nil {
						t.Fatal(err)
					}
				}

				for try := 1; try <= 5; try++ {
					inject.arm()
					err := kind.make(ctx, inst, src, snap)
					if err == nil || !strings.Contains(err.Error(), "injected failure") {
						t.Fatalf("try %d: %v; want the injected failure", try, err)
					}
					now, err := cl.Everything(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if !sameSet(now, before) {
						t.Fatalf("after failed try %d the pool holds %q; before the tries it held %q", try, now, before)
					}
				}
				if n, err := cl.PoolUsed(ctx); err != nil || n != du {
					t.Fatalf("rbd du after five failed tries: %d bytes (%v); before them %d", n, err, du)
				}
				if kind.name == "snapshot" {
					if grew := storedGrowth(t, ctx, cl, inst, stored, "pvc-probe"); grew > 1*MiB {
						t.Fatalf("ceph df: five failed tries grew the pool by %d bytes", grew)
					}
				}
				if err := kind.make(ctx, inst, src, snap); err != nil {
					t.Fatalf("the sixth try, with nothing injected: %v", err)
				}
			})
		}
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestDeleteInAnyOrderLeavesNothing: a volume, its snapshot, a restore of
// the snapshot and a clone of the volume, deleted in every order that
// matters: each delete answers at once, the data of every copy stays
// readable while it lives, and when all are deleted the pool holds
// nothing, trash and snapshots in every namespace included.
func TestDeleteInAnyOrderLeavesNothing(t *testing.T) {
	cl := rbdtest.Require(t)
	orders := [][]string{
		{"volume", "snapshot", "restore", "clone"},
		{"snapshot", "volume", "clone", "restore"},
		{"restore", "clone", "snapshot", "volume"},
		{"clone", "restore", "volume", "snapshot"},
	}
	for _, order := range orders {
		t.Run(strings.Join(order, ", "), func(t *testing.T) {
			inst, store, ctx := controller(t, cl, rbd.Config{}, nil)
			vol := mustCreate(t, ctx, inst, blockVolume("pvc-origin", 64*MiB, nil))
			sum, err := cl.WriteRandom(ctx, imageOf(t, cl, vol.ID), 64*MiB, 11)
			if err != nil {
				t.Fatal(err)
			}
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
					if got, err := cl.Checksum(ctx, imageOf(t, cl, id), 64*MiB); err != nil || got != sum {
						t.Fatalf("after deleting the %s, the %s reads sha256 %s (%v); want %s", what, name, got, err, sum)
					}
				}
			}
			settle(t, ctx, cl, store)
		})
	}
}

// TestEarlierVersionsObjects: a snapshot and a clone made the way earlier
// versions made them (a full copy carrying a protected csi-snap; a clone
// of format 1 hanging from a protected csi-clone- snapshot of its source)
// keep working: the snapshot is read and restored, and everything is
// deleted, the protected snapshots included, leaving nothing.
func TestEarlierVersionsObjects(t *testing.T) {
	cl := rbdtest.Require(t)
	inst, store, ctx := controller(t, cl, rbd.Config{}, nil)
	vol := mustCreate(t, ctx, inst, blockVolume("pvc-old", 16*MiB, nil))
	image := imageOf(t, cl, vol.ID)
	sum, err := cl.WriteRandom(ctx, image, 16*MiB, 5)
	if err != nil {
		t.Fatal(err)
	}
	p := func(s string) string { return cl.Pool + "/" + s }
	mustRBD := func(args ...string) {
		t.Helper()
		if _, err := cl.RBD(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}
	// The old CreateSnapshot: rbd cp of a csi-copy- snapshot, csi-snap
	// protected, the metadata as it wrote it.
	snapID := store.SnapshotID("snapshot-old")
	snapImage := imageOf(t, cl, snapID)
	copySnap := p(image) + "@csi-copy-" + strings.TrimPrefix(snapImage, "csi-snap-")
	mustRBD("snap", "create", copySnap)
	mustRBD("cp", "--no-progress", copySnap, p(snapImage))
	mustRBD("snap", "rm", copySnap)
	mustRBD("snap", "create", p(snapImage)+"@csi-snap")
	mustRBD("snap", "protect", p(snapImage)+"@csi-snap")
	for _, key := range []string{"spindle.volume", "spindle.name"} {
		mustRBD("image-meta", "remove", p(snapImage), key)
	}
	mustRBD("image-meta", "set", p(snapImage), "spindle.name", "snapshot-old")
	mustRBD("image-meta", "set", p(snapImage), "spindle.snapshot", fmt.Sprintf(`{"sourceImageID":%q,"sizeBytes":%d,"createdAt":"2026-01-02T03:04:05Z","accessType":"block","formatted":false}`, vol.ID, 16*MiB))
	// The old clone: format 1 from a protected csi-clone- snapshot.
	cloneID := store.ImageID("pvc-old-clone")
	cloneImage := imageOf(t, cl, cloneID)
	cloneSnap := p(image) + "@csi-clone-" + strings.TrimPrefix(cloneImage, "csi-vol-")
	mustRBD("snap", "create", cloneSnap)
	mustRBD("snap", "protect", cloneSnap)
	mustRBD("clone", "--rbd-default-clone-format", "1", cloneSnap, p(cloneImage))
	mustRBD("image-meta", "set", p(cloneImage), "spindle.volume", fmt.Sprintf(`{"accessType":"block","source":{"ImageID":%q},"createdAt":"2026-01-02T03:04:05Z"}`, vol.ID))
	mustRBD("image-meta", "set", p(cloneImage), "spindle.name", "pvc-old-clone")

	got, err := inst.Snapshots.GetSnapshot(ctx, snapID)
	if err != nil || got.Name != "snapshot-old" || got.SourceImageID != vol.ID || !got.ReadyToUse {
		t.Fatalf("GetSnapshot of an old snapshot = %+v, %v", got, err)
	}
	restored := mustCreate(t, ctx, inst, blockVolume("pvc-from-old", 16*MiB, &backend.ContentSource{SnapshotID: snapID}))
	for _, id := range []string{restored.ID, cloneID} {
		if got, err := cl.Checksum(ctx, imageOf(t, cl, id), 16*MiB); err != nil || got != sum {
			t.Fatalf("%s reads sha256 %s (%v); want %s", id, got, err, sum)
		}
	}

	// The old snapshot's protected csi-snap has a clone: the delete is
	// refused (ABORTED, retried by the sidecar) while the restore is
	// flattened in the background, then goes through.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		err := inst.Snapshots.DeleteSnapshot(ctx, snapID)
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "flattened in the background") || time.Now().After(deadline) {
			t.Fatalf("DeleteSnapshot of an old snapshot with a restore: %v", err)
		}
		time.Sleep(time.Second)
	}
	if got, err := cl.Checksum(ctx, imageOf(t, cl, restored.ID), 16*MiB); err != nil || got != sum {
		t.Fatalf("the restore of the deleted old snapshot reads sha256 %s (%v); want %s", got, err, sum)
	}
	// The old clone first, then its source: the protected csi-clone-
	// snapshot goes once the clone is gone.
	for _, id := range []string{cloneID, restored.ID} {
		if err := inst.Store.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	deadline = time.Now().Add(3 * time.Minute)
	for {
		if _, err := store.Maintain(ctx); err != nil {
			t.Logf("maintain: %v", err)
		}
		err := inst.Store.Delete(ctx, vol.ID)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Delete of the old clone's source: %v", err)
		}
		time.Sleep(time.Second)
	}
	settle(t, ctx, cl, store)
}

// TestNamePrefixesLeaveNothing: a volume of a volumeNamePrefix and its
// snapshot of a snapshotNamePrefix go to the trash under names that are
// not Spindle's own prefixes, with clones hanging from them; deleted in the
// order that leaves both waiting in the trash, nothing is left once all
// are gone. An image somebody else moved to the trash stays there.
func TestNamePrefixesLeaveNothing(t *testing.T) {
	cl := rbdtest.Require(t)
	inst, store, ctx := controller(t, cl, rbd.Config{}, nil)
	foreign := "backup-of-something"
	if _, err := cl.RBD(ctx, "create", "--size", "4M", cl.Pool+"/"+foreign); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.RBD(ctx, "trash", "mv", cl.Pool+"/"+foreign); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		trash, _ := cl.Trash(context.Background())
		for _, e := range trash {
			if e.Name == foreign {
				_, _ = cl.RBD(context.Background(), "trash", "rm", "--no-progress", "--pool", cl.Pool, e.ID)
			}
		}
	})

	spec := blockVolume("pvc-prefixed", 32*MiB, nil)
	spec.Parameters = map[string]string{"volumeNamePrefix": "pg-"}
	vol := mustCreate(t, ctx, inst, spec)
	if image := imageOf(t, cl, vol.ID); !strings.HasPrefix(image, "pg-") {
		t.Fatalf("the volume's image is %s, want a pg- name", image)
	}
	sum, err := cl.WriteRandom(ctx, imageOf(t, cl, vol.ID), 32*MiB, 3)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := inst.Snapshots.CreateSnapshot(ctx, backend.SnapshotSpec{Name: "snapshot-prefixed", SourceImageID: vol.ID, Parameters: map[string]string{"snapshotNamePrefix": "pgsnap-"}})
	if err != nil {
		t.Fatal(err)
	}
	if image := imageOf(t, cl, snap.ID); !strings.HasPrefix(image, "pgsnap-") {
		t.Fatalf("the snapshot's image is %s, want a pgsnap- name", image)
	}
	restore := mustCreate(t, ctx, inst, blockVolume("pvc-prefixed-restore", 32*MiB, &backend.ContentSource{SnapshotID: snap.ID}))
	// The volume while its snapshot lives, the snapshot while its restore
	// lives: both wait in the trash, as pg- and pgsnap- names.
	if err := inst.Store.Delete(ctx, vol.ID); err != nil {
		t.Fatal(err)
	}
	if err := inst.Snapshots.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := cl.Checksum(ctx, imageOf(t, cl, restore.ID), 32*MiB); err != nil || got != sum {
		t.Fatalf("the restore reads sha256 %s (%v); want %s", got, err, sum)
	}
	if err := inst.Store.Delete(ctx, restore.ID); err != nil {
		t.Fatal(err)
	}
	settle(t, ctx, cl, store, "trash:"+foreign)
	if out, err := cl.RBD(ctx, "trash", "ls", "--format", "json", cl.Pool); err != nil || strings.Contains(string(out), "pg-") {
		t.Fatalf("rbd trash ls: %s (%v)", out, err)
	}
}
