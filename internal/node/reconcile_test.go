package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
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

	intact, damaged := w.v.Reconcile(context.Background(), resolverOf(t, whole, block, dead, gone))

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

// Encrypted volumes: one whose dm-crypt mapping is open and mounted (and a
// block one whose mapping is open) is whole; a block one whose mapping was
// closed under its record, and one whose mount on the mapping died, are
// not, and the report says what is wrong. No mount, mapping or device
// changes.
func TestReconcileEncrypted(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	whole := w.newVolume("pvc-luks-whole", backend.AccessMount, backend.SingleNodeWriter, false)
	block := w.newVolume("pvc-luks-block", backend.AccessBlock, backend.SingleNodeWriter, false)
	// A block volume: its stage mounts nothing, so only the mapping can
	// tell that it is not whole.
	closed := w.newVolume("pvc-luks-closed", backend.AccessBlock, backend.SingleNodeWriter, false)
	dead := w.newVolume("pvc-luks-dead", backend.AccessMount, backend.SingleNodeWriter, false)
	all := []*testVolume{whole, block, closed, dead}
	for _, tv := range all {
		w.mustStageEncrypted(tv)
	}
	w.mustPublish(whole, whole.target, false)
	if err := w.host.LUKSClose(ctx, CryptName(closed.ID)); err != nil {
		t.Fatal(err)
	}
	w.host.KillMount(dead.staging)
	before, mappingsBefore := w.state(), w.host.CryptMappings()
	w.host.Calls = nil

	intact, damaged := w.v.Reconcile(ctx, resolverOf(t, all...))

	got := map[string]bool{}
	for _, s := range intact {
		got[s.VolumeID] = true
		if !s.Encrypted || s.CryptMapping != MapperPath(CryptName(s.VolumeID)) {
			t.Errorf("%s reported encrypted=%v mapping %q, want its mapping %s", s.VolumeID, s.Encrypted, s.CryptMapping, MapperPath(CryptName(s.VolumeID)))
		}
	}
	if len(intact) != 2 || !got[whole.ID] || !got[block.ID] {
		t.Errorf("whole: %+v, want %s and %s", intact, whole.ID, block.ID)
	}
	problems := map[string]string{}
	for _, s := range damaged {
		problems[s.VolumeID] = s.MountState + "/" + s.DeviceState + ": " + s.Problem
	}
	if len(damaged) != 2 || !strings.Contains(problems[closed.ID], "dm-crypt mapping "+CryptName(closed.ID)+" is not open") ||
		!strings.Contains(problems[dead.ID], "dead") {
		t.Fatalf("not whole: %v, want %s (mapping closed) and %s (dead mount on its mapping)", problems, closed.ID, dead.ID)
	}
	t.Logf("reported: %v", problems)
	if after := w.state(); !after.equal(before) {
		t.Errorf("Reconcile changed the node:\nbefore %+v\nafter  %+v", before, after)
	}
	if after := w.host.CryptMappings(); !slices.Equal(after, mappingsBefore) {
		t.Errorf("Reconcile changed the dm-crypt mappings: before %v, after %v", mappingsBefore, after)
	}
	for _, c := range w.host.Calls {
		if strings.HasPrefix(c, "luks") {
			t.Errorf("Reconcile ran %q", c)
		}
	}
}

// resolverOf resolves the volume IDs of vols, and fails the test on any other.
func resolverOf(t *testing.T, vols ...*testVolume) func(string) (Volume, error) {
	return func(id string) (Volume, error) {
		for _, tv := range vols {
			if tv.ID == id {
				return tv.Volume, nil
			}
		}
		t.Errorf("resolve(%s): not a volume of the test", id)
		return Volume{}, fmt.Errorf("%s is not a volume of the test", id)
	}
}
