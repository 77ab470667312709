//go:build cgo && ceph

package rbd_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/rbd"
	"github.com/spindle-csi/spindle/internal/backend/rbd/rbdtest"
)

// storedGrowth is how much more the pool stores now than before, by "ceph
// df". The OSD reports its statistics every few seconds, so it writes a
// probe of known size into a volume of its own and waits until ceph df
// counts it: then every change before the probe is counted too.
func storedGrowth(t *testing.T, ctx context.Context, cl *rbdtest.Cluster, inst *backend.Instance, before int64, probeName string) int64 {
	t.Helper()
	const probe = 8 * MiB
	img := mustCreate(t, ctx, inst, blockVolume(probeName, probe, nil))
	if _, err := cl.WriteRandom(ctx, strings.TrimPrefix(img.ID, cl.Pool+"/"), probe, 7); err != nil {
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
	c := realCluster(t)
	inst, store, ctx, _ := controller(t, c, rbd.Config{})
	const data = 2 * GiB
	// The pool was just emptied; ceph df says so within seconds.
	empty := func(n int64) bool { return n < MiB }
	baseline, err := cl.AwaitStored(ctx, 2*time.Minute, empty)
	if err != nil {
		t.Fatal(err)
	}

	vol := mustCreate(t, ctx, inst, blockVolume("pvc-database", data, nil))
	t0 := time.Now()
	sum, err := cl.WriteRandom(ctx, imageOf(t, c, vol.ID), data, 29)
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
	if got, err := cl.Checksum(ctx, imageOf(t, c, restored.ID), data); err != nil || got != sum {
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
	if got, err := cl.Checksum(ctx, imageOf(t, c, restored.ID), data); err != nil || got != sum {
		t.Fatalf("after its source and snapshot were deleted, the restored volume reads sha256 %s (%v); want %s", got, err, sum)
	}
	if err := inst.Store.Delete(ctx, restored.ID); err != nil {
		t.Fatal(err)
	}
	settle(t, ctx, c, store)
	after, err := cl.AwaitStored(ctx, 3*time.Minute, empty)
	if err != nil {
		t.Fatalf("with everything deleted: %v (it stored %d before the test)", err, baseline)
	}
	t.Logf("%d GiB written in %s; snapshot ready in %s, restore in %s; the emptied pool stores %d bytes",
		data/GiB, wrote.Round(time.Millisecond), ready.Round(time.Millisecond), restoredIn.Round(time.Millisecond), after)
}
