package controller

import (
	"slices"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

func snapshotIDs(snaps []Snapshot) []string {
	var out []string
	for _, s := range snaps {
		out = append(out, s.ID)
	}
	return out
}

func TestSnapshots(t *testing.T) {
	e := newEnv(t)
	a := e.mustCreate(t, createReq("pvc-a"))
	b := e.mustCreate(t, createReq("pvc-b"))
	snapA, err := e.c.CreateSnapshot(e.ctx, "snap-a", mustID(t, a.ID), map[string]string{"csi.storage.k8s.io/volumesnapshot/name": "x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if snapA.SourceVolumeID != a.ID || snapA.SizeBytes != 8*mib || !snapA.ReadyToUse || snapA.ID != defaultKey+"/snap-a" {
		t.Fatalf("snapshot %+v", snapA)
	}
	again, err := e.c.CreateSnapshot(e.ctx, "snap-a", mustID(t, a.ID), nil, nil)
	if err != nil || again.ID != snapA.ID {
		t.Fatalf("a repeated CreateSnapshot = %+v, %v", again, err)
	}
	if _, err := e.c.CreateSnapshot(e.ctx, "snap-b", mustID(t, b.ID), nil, nil); err != nil {
		t.Fatal(err)
	}
	refusals := []struct {
		name     string
		snap     string
		source   string
		params   map[string]string
		kind     error
		mentions []string
	}{
		{"the name taken by another volume's snapshot", "snap-a", b.ID, nil, errdefs.ErrAlreadyExists, []string{"snap-a"}},
		{"a parameter the backend does not take", "snap-c", a.ID, map[string]string{"pool": "x"}, errdefs.ErrInvalidArgument, []string{`"pool"`, "no snapshot parameters"}},
		{"a volume that does not exist", "snap-c", defaultKey + "/pvc-none", nil, errdefs.ErrNotFound, []string{"pvc-none"}},
		{"a backend not configured", "snap-c", "loop/gone/pvc-a", nil, errdefs.ErrPrecondition, []string{"loop/gone"}},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.c.CreateSnapshot(e.ctx, tc.snap, mustID(t, tc.source), tc.params, nil)
			wantKind(t, err, tc.kind, tc.mentions...)
		})
	}

	got, err := e.c.GetSnapshot(e.ctx, mustID(t, snapA.ID))
	if err != nil || got.ID != snapA.ID || got.SourceVolumeID != a.ID {
		t.Fatalf("GetSnapshot = %+v, %v", got, err)
	}
	_, err = e.c.GetSnapshot(e.ctx, mustID(t, defaultKey+"/snap-none"))
	wantKind(t, err, errdefs.ErrNotFound, "snap-none")

	lists := []struct {
		name              string
		snapshot, fromVol string
		want              []string
	}{
		{"all", "", "", []string{defaultKey + "/snap-a", defaultKey + "/snap-b"}},
		{"one", snapA.ID, "", []string{snapA.ID}},
		{"of one volume", "", b.ID, []string{defaultKey + "/snap-b"}},
		{"one that does not exist", defaultKey + "/snap-none", "", nil},
		{"of another instance", fastKey + "/snap-a", "", nil},
		{"of no Spindle volume", "", "pvc-elsewhere", nil},
	}
	for _, tc := range lists {
		t.Run("list "+tc.name, func(t *testing.T) {
			snaps, err := e.c.ListSnapshots(e.ctx, tc.snapshot, tc.fromVol)
			if err != nil || !slices.Equal(snapshotIDs(snaps), tc.want) {
				t.Fatalf("ListSnapshots = %v, %v; want %v", snapshotIDs(snaps), err, tc.want)
			}
		})
	}

	if err := e.c.DeleteSnapshot(e.ctx, mustID(t, snapA.ID)); err != nil {
		t.Fatal(err)
	}
	if err := e.c.DeleteSnapshot(e.ctx, mustID(t, snapA.ID)); err != nil {
		t.Fatalf("deleting a snapshot again: %v", err)
	}
	_, err = e.c.GetSnapshot(e.ctx, mustID(t, snapA.ID))
	wantKind(t, err, errdefs.ErrNotFound)
}

// An encrypted volume's snapshot keeps the volume's passphrase under a wrap
// of its own, so it outlives the volume's key.
func TestSnapshotOfAnEncryptedVolume(t *testing.T) {
	e := newEnv(t)
	vol := e.mustCreate(t, CreateRequest{Name: "pvc-enc", Capabilities: []Capability{mountRW}, RequiredBytes: 32 * mib, Parameters: map[string]string{"encrypted": "true"}})
	if _, err := e.c.CreateSnapshot(e.ctx, "snap-enc", mustID(t, vol.ID), nil, nil); err != nil {
		t.Fatal(err)
	}
	snap, err := e.pools[defaultKey].GetSnapshot(e.ctx, "snap-enc")
	if err != nil {
		t.Fatal(err)
	}
	if snap.Encryption == nil || snap.Encryption.KeyOwner != "snapshot/snap-enc" {
		t.Fatalf("snapshot encryption %+v", snap.Encryption)
	}
	// Without the secrets, the volume's key does not unwrap: nothing is made.
	noSecrets := backend.WithSecrets(t.Context(), nil)
	_, err = e.c.CreateSnapshot(noSecrets, "snap-nokey", mustID(t, vol.ID), nil, nil)
	if err == nil {
		t.Fatal("a snapshot of an encrypted volume was made without the secrets that unwrap its key")
	}
	if _, err := e.pools[defaultKey].GetSnapshot(e.ctx, "snap-nokey"); errdefs.KindOf(err) != errdefs.ErrNotFound {
		t.Fatalf("a refused snapshot was made: %v", err)
	}
}

// The loop backend cannot snapshot several volumes at one instant: group
// snapshots are refused, naming why, and the capability is not reported.
func TestGroupSnapshotsRefused(t *testing.T) {
	e := newEnv(t)
	if e.c.GroupSnapshots() {
		t.Fatal("group snapshots reported by instances that take none")
	}
	a := e.mustCreate(t, createReq("pvc-a"))
	b := e.mustCreate(t, createReq("pvc-b"))
	far := e.mustCreate(t, CreateRequest{Name: "pvc-far", Capabilities: []Capability{mountRW}, RequiredBytes: 8 * mib, Parameters: map[string]string{"backend": fastKey}})
	ids := func(vols ...*Volume) []volumeid.ID {
		var out []volumeid.ID
		for _, v := range vols {
			out = append(out, mustID(t, v.ID))
		}
		return out
	}
	tests := []struct {
		name     string
		sources  []volumeid.ID
		params   map[string]string
		mentions []string
	}{
		{"a backend without group snapshots", ids(a, b), nil, []string{"backend " + defaultKey + " cannot take group snapshots"}},
		{"volumes of two instances", ids(a, far), nil, []string{a.ID + " is on backend " + defaultKey, far.ID + " on " + fastKey}},
		{"a volume named twice", ids(a, a), nil, []string{"source_volume_ids[1]", "named twice"}},
		{"no volumes", nil, nil, []string{"source_volume_ids is required"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.c.CreateGroupSnapshot(e.ctx, "group-1", tc.sources, tc.params)
			wantKind(t, err, errdefs.ErrInvalidArgument, tc.mentions...)
		})
	}
	_, err := e.c.GetGroupSnapshot(e.ctx, mustID(t, defaultKey+"/group-1"), nil)
	wantKind(t, err, errdefs.ErrInvalidArgument, "cannot take group snapshots")
	wantKind(t, e.c.DeleteGroupSnapshot(e.ctx, mustID(t, defaultKey+"/group-1"), nil), errdefs.ErrInvalidArgument, "cannot take group snapshots")
	if snaps, _ := e.c.ListSnapshots(e.ctx, "", ""); len(snaps) != 0 {
		t.Fatalf("a refused group snapshot left %v", snapshotIDs(snaps))
	}
}

// On a backend that takes group snapshots: made once by name, described
// with their members, checked against the members a request names, and
// deleted with them.
func TestGroupSnapshots(t *testing.T) {
	e := newEnv(t, func(insts backend.Instances) {
		insts[defaultKey].GroupSnapshots = backend.NewFakeGroupSnapshots(insts[defaultKey].Snapshots)
	})
	if !e.c.GroupSnapshots() {
		t.Fatal("group snapshots not reported")
	}
	a := e.mustCreate(t, createReq("pvc-a"))
	b := e.mustCreate(t, createReq("pvc-b"))
	sources := []volumeid.ID{mustID(t, a.ID), mustID(t, b.ID)}
	g, err := e.c.CreateGroupSnapshot(e.ctx, "group-1", sources, map[string]string{"csi.storage.k8s.io/group-snapshot-name": "x"})
	if err != nil {
		t.Fatal(err)
	}
	members := snapshotIDs(g.Snapshots)
	if g.ID != defaultKey+"/group-group-1" || len(members) != 2 || g.Snapshots[0].SourceVolumeID != a.ID || g.Snapshots[1].SourceVolumeID != b.ID {
		t.Fatalf("group snapshot %+v", g)
	}
	if again, err := e.c.CreateGroupSnapshot(e.ctx, "group-1", sources, nil); err != nil || again.ID != g.ID {
		t.Fatalf("a repeated CreateGroupSnapshot = %+v, %v", again, err)
	}
	_, err = e.c.CreateGroupSnapshot(e.ctx, "group-1", sources[:1], nil)
	wantKind(t, err, errdefs.ErrAlreadyExists, "group-1")
	_, err = e.c.CreateGroupSnapshot(e.ctx, "group-2", sources, map[string]string{"consistency": "fs"})
	wantKind(t, err, errdefs.ErrInvalidArgument, `"consistency"`, "no group snapshot parameters")

	got, err := e.c.GetGroupSnapshot(e.ctx, mustID(t, g.ID), members)
	if err != nil || !slices.Equal(snapshotIDs(got.Snapshots), members) {
		t.Fatalf("GetGroupSnapshot = %+v, %v", got, err)
	}
	_, err = e.c.GetGroupSnapshot(e.ctx, mustID(t, g.ID), members[:1])
	wantKind(t, err, errdefs.ErrInvalidArgument, "are not the members of group snapshot "+g.ID)
	_, err = e.c.GetGroupSnapshot(e.ctx, mustID(t, defaultKey+"/group-none"), nil)
	wantKind(t, err, errdefs.ErrNotFound, "group-none")

	wantKind(t, e.c.DeleteGroupSnapshot(e.ctx, mustID(t, g.ID), members[1:]), errdefs.ErrInvalidArgument, "are not the members")
	if err := e.c.DeleteGroupSnapshot(e.ctx, mustID(t, g.ID), members); err != nil {
		t.Fatal(err)
	}
	if err := e.c.DeleteGroupSnapshot(e.ctx, mustID(t, g.ID), nil); err != nil {
		t.Fatalf("deleting a group snapshot again: %v", err)
	}
	if snaps, _ := e.c.ListSnapshots(e.ctx, "", ""); len(snaps) != 0 {
		t.Fatalf("members left after the delete: %v", snapshotIDs(snaps))
	}
}
