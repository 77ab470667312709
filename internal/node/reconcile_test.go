package node

import (
	"context"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
)

// A restarted node plugin finds its volumes: those whole are adopted, one
// whose staging mount died and one whose device is gone are reported with
// what is wrong, and nothing on the node changes.
func TestReconcileChangesNothing(t *testing.T) {
	w := newWorld(t)
	whole := w.newVolume("pvc-whole", backend.AccessMount, backend.SingleNodeWriter, false)
	block := w.newVolume("pvc-block", backend.AccessBlock, backend.SingleNodeWriter, false)
	dead := w.newVolume("pvc-dead", backend.AccessMount, backend.SingleNodeWriter, false)
	gone := w.newVolume("pvc-gone", backend.AccessBlock, backend.SingleNodeWriter, false)
	for _, tv := range []*testVolume{whole, block, dead, gone} {
		w.mustStage(tv)
	}
	w.mustPublish(whole, whole.target, false)
	w.host.KillMount(dead.staging)
	// The block volume's device went away under the record (detached by
	// hand, or its daemon died).
	rec, err := w.host.StageRecord(gone.staging)
	if err != nil {
		t.Fatal(err)
	}
	delete(w.loops.Devices, rec.Device)
	before := w.state()

	resolve := func(id string) (Volume, error) {
		for _, tv := range []*testVolume{whole, block, dead, gone} {
			if tv.ID == id {
				return tv.Volume, nil
			}
		}
		t.Fatalf("resolve(%s): not a volume of the test", id)
		return Volume{}, nil
	}
	intact, damaged := w.v.Reconcile(context.Background(), resolve)

	got := map[string]bool{}
	for _, s := range intact {
		got[s.VolumeID] = true
	}
	if len(intact) != 2 || !got[whole.ID] || !got[block.ID] {
		t.Errorf("whole: %+v, want %s and %s", intact, whole.ID, block.ID)
	}
	for _, s := range intact {
		if s.VolumeID == whole.ID && (len(s.Publishes) != 1 || s.Publishes[0] != whole.target) {
			t.Errorf("%s publishes %v, want its pod's bind %s", s.VolumeID, s.Publishes, whole.target)
		}
	}
	problems := map[string]string{}
	for _, s := range damaged {
		problems[s.VolumeID] = s.MountState + "/" + s.DeviceState + ": " + s.Problem
	}
	if len(damaged) != 2 || problems[dead.ID] == "" || problems[gone.ID] == "" {
		t.Fatalf("not whole: %v, want %s (dead mount) and %s (device gone)", problems, dead.ID, gone.ID)
	}
	t.Logf("reported: %v", problems)
	if after := w.state(); !after.equal(before) {
		t.Errorf("Reconcile changed the node:\nbefore %+v\nafter  %+v", before, after)
	}
}
