package rbd_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/backend/rbd"
	"github.com/spindle-csi/spindle/internal/backend/rbd/rbdtest"
)

// created is an image's or snapshot's time as the rbd CLI prints it.
func created(t *testing.T, cl *rbdtest.Cluster, args ...string) time.Time {
	t.Helper()
	out, err := cl.RBD(context.Background(), append(args, "--format", "json")...)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		CreateTimestamp string `json:"create_timestamp"`
	}
	var snaps []struct {
		Name      string `json:"name"`
		Timestamp string `json:"timestamp"`
	}
	ts := ""
	if args[0] == "snap" {
		if err := json.Unmarshal(out, &snaps); err != nil {
			t.Fatal(err)
		}
		for _, s := range snaps {
			ts = max(ts, s.Timestamp) // one snapshot per call below
		}
	} else {
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatal(err)
		}
		ts = v.CreateTimestamp
	}
	at, err := time.ParseInLocation("Mon Jan _2 15:04:05 2006", strings.Join(strings.Fields(ts), " "), time.Local)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// TestSweepRemovesCrashLeftovers: a controller that died in the middle of
// a CreateVolume or CreateSnapshot left a temporary image (one with the
// protected snapshot a snapshot image gets) and a copy snapshot on a
// volume. Opening the store in a controller (Sweep) removes those older
// than rbd.LeftoverAge and keeps fresh ones, which may belong to a Create
// still running in another controller, and everything that is not a
// leftover.
func TestSweepRemovesCrashLeftovers(t *testing.T) {
	cl := rbdtest.Require(t)
	ctx := context.Background()
	inst := newNode(t, cl, false)
	id := createVolume(t, cl, inst, "pvc-swept")
	vol := imageOf(t, cl, id)
	p := func(s string) string { return cl.Pool + "/" + s }
	mustRBD := func(args ...string) {
		t.Helper()
		if _, err := cl.RBD(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}

	// The leftovers of a crash, old by the time the controller restarts.
	oldTmp, oldSnapTmp := "csi-tmp-0123456789abcdef-00000001", "csi-tmp-fedcba9876543210-00000002"
	mustRBD("create", "--size", "4M", p(oldTmp))
	mustRBD("create", "--size", "4M", p(oldSnapTmp))
	mustRBD("snap", "create", p(oldSnapTmp)+"@csi-snap")
	mustRBD("snap", "protect", p(oldSnapTmp)+"@csi-snap")
	oldCopy := p(vol) + "@csi-copy-0123456789abcdef0123456789abcdef"
	mustRBD("snap", "create", oldCopy)
	newest := created(t, cl, "snap", "ls", p(vol))
	for _, img := range []string{oldTmp, oldSnapTmp} {
		if at := created(t, cl, "info", p(img)); at.After(newest) {
			newest = at
		}
	}

	// Images and snapshots the sweep must keep: not Spindle's, or not
	// leftovers, or leftovers younger than LeftoverAge.
	time.Sleep(time.Until(newest.Add(1100 * time.Millisecond)))
	freshTmp := "csi-tmp-00000000000000aa-00000003"
	mustRBD("create", "--size", "4M", p(freshTmp))
	freshCopy := p(vol) + "@csi-copy-aa000000000000000000000000000000"
	mustRBD("snap", "create", freshCopy)
	mustRBD("create", "--size", "4M", p("not-spindles"))
	mustRBD("snap", "create", p(vol)+"@operator-backup")
	if at := created(t, cl, "info", p(freshTmp)); !at.After(newest) {
		t.Fatalf("the fresh temporary image is from %s, not after the old leftovers (%s)", at, newest)
	}

	// Ten minutes after the newest old leftover.
	rbd.SetClock(inst, func() time.Time { return newest.Add(rbd.LeftoverAge) })
	t0 := time.Now()
	removed, err := inst.Store.(*rbd.Store).Sweep(ctx)
	if err != nil {
		t.Fatalf("sweep: %v (removed %v)", err, removed)
	}
	took := time.Since(t0)
	slices.Sort(removed)
	want := []string{p(oldTmp), p(oldSnapTmp), oldCopy}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Fatalf("sweep removed %v; want %v", removed, want)
	}
	arts, err := cl.Artifacts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(arts)
	keep := []string{vol, vol + "@" + strings.TrimPrefix(freshCopy, p(vol)+"@"), vol + "@operator-backup", freshTmp, "not-spindles"}
	slices.Sort(keep)
	if !slices.Equal(arts, keep) {
		t.Fatalf("after the sweep the pool holds %v; want %v", arts, keep)
	}
	// The volume is intact.
	if img, err := inst.Store.Get(ctx, id); err != nil || img.Name != "pvc-swept" {
		t.Fatalf("volume after the sweep: %+v, %v", img, err)
	}
	// A second sweep finds nothing more.
	if again, err := inst.Store.(*rbd.Store).Sweep(ctx); err != nil || len(again) != 0 {
		t.Fatalf("second sweep: removed %v, %v; want nothing", again, err)
	}
	t.Logf("sweep removed %d leftovers in %s", len(removed), took.Round(time.Millisecond))
}
