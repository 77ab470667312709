//go:build cgo && ceph

package rbd_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/rbd"
	"github.com/spindle-csi/spindle/internal/backend/rbd/rbdtest"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// BenchmarkSnapshotRBD (make bench) prints what a CSI snapshot of a volume
// full of data costs on the test cluster, and what a chain of snapshots of
// restores of snapshots costs with the clone depth limits at work (soft 4:
// flattened in the background; hard 8: refused with ABORTED, and retried
// here as the sidecars retry, until the flatten is done). It asserts
// nothing about time.
func BenchmarkSnapshotRBD(b *testing.B) {
	cl := rbdtest.Require(b)
	for range b.N {
		benchSnapshot(b, cl, 2*GiB)
		benchChain(b, cl, 256*MiB, 10)
	}
}

func benchSnapshot(b *testing.B, cl *rbdtest.Cluster, data int64) {
	inst, store, ctx := benchController(b, cl)
	vol := benchCreate(b, ctx, inst, blockVolume("pvc-bench", data, nil))
	if _, err := cl.WriteRandom(ctx, imageIn(b, cl, vol.ID), data, 1); err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	snap, err := inst.Snapshots.CreateSnapshot(ctx, backend.SnapshotSpec{Name: "snapshot-bench", SourceImageID: vol.ID})
	if err != nil || !snap.ReadyToUse {
		b.Fatalf("CreateSnapshot = %+v, %v", snap, err)
	}
	ready := time.Since(t0)
	t0 = time.Now()
	benchCreate(b, ctx, inst, blockVolume("pvc-bench-restored", data, &backend.ContentSource{SnapshotID: snap.ID}))
	restored := time.Since(t0)
	fmt.Printf("snapshot rbd: %.1f GiB written, ready in %.2f s, restore in %.2f s\n", float64(data)/float64(GiB), ready.Seconds(), restored.Seconds())
	benchWipe(b, ctx, cl, store)
}

func benchChain(b *testing.B, cl *rbdtest.Cluster, data int64, links int) {
	inst, store, ctx := benchController(b, cl)
	vol := benchCreate(b, ctx, inst, blockVolume("pvc-chain-0", data, nil))
	if _, err := cl.WriteRandom(ctx, imageIn(b, cl, vol.ID), data, 2); err != nil {
		b.Fatal(err)
	}
	var readies, restores []time.Duration
	aborted, deepest := 0, 0
	// retry calls f until it succeeds, counting the ABORTED answers of the
	// hard limit, as a sidecar retries them.
	retry := func(f func() error) time.Duration {
		t0 := time.Now()
		for {
			err := f()
			if err == nil {
				return time.Since(t0)
			}
			if errdefs.KindOf(err) != errdefs.ErrBusy || time.Since(t0) > 10*time.Minute {
				b.Fatal(err)
			}
			aborted++
			time.Sleep(time.Second)
		}
	}
	src := vol
	for i := 1; i <= links; i++ {
		var snap *backend.Snapshot
		readies = append(readies, retry(func() (err error) {
			snap, err = inst.Snapshots.CreateSnapshot(ctx, backend.SnapshotSpec{Name: fmt.Sprintf("snapshot-chain-%d", i), SourceImageID: src.ID})
			return err
		}))
		var next *backend.Image
		restores = append(restores, retry(func() (err error) {
			next, err = inst.Store.Create(ctx, blockVolume(fmt.Sprintf("pvc-chain-%d", i), data, &backend.ContentSource{SnapshotID: snap.ID}))
			return err
		}))
		for _, id := range []string{snap.ID, next.ID} {
			if d := recordedDepth(b, ctx, cl, id); d > deepest {
				deepest = d
			}
		}
		src = next
	}
	fmt.Printf("snapshot rbd chain: %d x snapshot->restore of %.1f GiB, snapshot ready in %.2f s, restore in %.2f s (medians; slowest %.2f s / %.2f s), %d answers ABORTED at the hard limit, deepest chain %d (soft limit %d, hard %d)\n",
		links, float64(data)/float64(GiB), median(readies).Seconds(), median(restores).Seconds(), slices.Max(readies).Seconds(), slices.Max(restores).Seconds(),
		aborted, deepest, rbd.DefaultMaxCloneDepth, rbd.DefaultHardMaxCloneDepth)
	benchWipe(b, ctx, cl, store)
}

// recordedDepth is the spindle.depth an image recorded (0: none).
func recordedDepth(b *testing.B, ctx context.Context, cl *rbdtest.Cluster, id string) int {
	out, err := cl.RBD(ctx, "image-meta", "get", cl.Pool+"/"+imageIn(b, cl, id), "spindle.depth")
	if err != nil {
		return 0
	}
	var d int
	_, _ = fmt.Sscan(string(out), &d)
	return d
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func benchController(b *testing.B, cl *rbdtest.Cluster) (*backend.Instance, *rbd.Store, context.Context) {
	if err := cl.Wipe(context.Background()); err != nil {
		b.Fatal(err)
	}
	inst, err := rbd.New("test", rbd.Config{ClusterID: "test", Monitors: []string{"v2:" + cl.Monitor}, Pool: cl.Pool, Mounter: rbd.MounterFuse, UserID: cl.User, KeyFile: cl.KeyFile}, command.New(utilexec.New(), nil))
	if err != nil {
		b.Fatal(err)
	}
	return inst, inst.Store.(*rbd.Store), backend.WithSecrets(b.Context(), cl.Secrets())
}

func benchCreate(b *testing.B, ctx context.Context, inst *backend.Instance, spec backend.VolumeSpec) *backend.Image {
	img, err := inst.Store.Create(ctx, spec)
	if err != nil {
		b.Fatalf("Create %s: %v", spec.Name, err)
	}
	return img
}

func benchWipe(b *testing.B, ctx context.Context, cl *rbdtest.Cluster, store *rbd.Store) {
	_, _ = store.Maintain(ctx)
	if err := cl.Wipe(context.Background()); err != nil {
		b.Fatal(err)
	}
}
