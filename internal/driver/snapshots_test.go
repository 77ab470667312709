package driver

import (
	"context"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/spindle-csi/spindle/internal/backend"
)

// TestGroupSnapshots: the GroupController is reported only when a backend
// can take group snapshots; a backend that cannot refuses, naming itself;
// a group spans one instance; members carry the group's ID; get and
// delete check the member list they are given; repeats are idempotent.
func TestGroupSnapshots(t *testing.T) {
	e := newTestEnv(t)
	gs := &groupControllerService{d: e.d}
	ctx := context.Background()
	caps, err := gs.GroupControllerGetCapabilities(ctx, &csi.GroupControllerGetCapabilitiesRequest{})
	if err != nil || len(caps.GetCapabilities()) != 0 {
		t.Fatalf("without a backend that takes group snapshots: capabilities %v, %v; want none", caps.GetCapabilities(), err)
	}
	var ids []string
	for _, name := range []string{"pvc-data", "pvc-wal"} {
		req := createReq(name)
		req.Parameters = map[string]string{"backend": fastKey}
		v, err := e.CreateVolume(req)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.GetVolume().GetVolumeId())
	}
	create := func(name string, sources ...string) (*csi.CreateVolumeGroupSnapshotResponse, error) {
		return call(e, "/csi.v1.GroupController/CreateVolumeGroupSnapshot", gs.CreateVolumeGroupSnapshot,
			&csi.CreateVolumeGroupSnapshotRequest{Name: name, SourceVolumeIds: sources})
	}
	_, err = create("group-1", ids...)
	wantCode(t, err, codes.InvalidArgument, "backend loop/fast cannot take group snapshots")

	fast := e.d.instances[fastKey]
	fast.GroupSnapshots = backend.NewFakeGroupSnapshots(fast.Snapshots)
	caps, err = gs.GroupControllerGetCapabilities(ctx, &csi.GroupControllerGetCapabilitiesRequest{})
	if err != nil || len(caps.GetCapabilities()) != 1 || caps.GetCapabilities()[0].GetRpc().GetType() != csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT {
		t.Fatalf("capabilities %v, %v; want CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT", caps.GetCapabilities(), err)
	}
	plugin, err := e.is.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil || !slices.ContainsFunc(plugin.GetCapabilities(), func(c *csi.PluginCapability) bool {
		return c.GetService().GetType() == csi.PluginCapability_Service_GROUP_CONTROLLER_SERVICE
	}) {
		t.Fatalf("plugin capabilities %v, %v; want GROUP_CONTROLLER_SERVICE", plugin.GetCapabilities(), err)
	}

	other, err := e.CreateVolume(createReq("pvc-elsewhere"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = create("group-mixed", ids[0], other.GetVolume().GetVolumeId())
	wantCode(t, err, codes.InvalidArgument, "must be on one backend instance")
	_, err = create("group-twice", ids[0], ids[0])
	wantCode(t, err, codes.InvalidArgument, "named twice")
	_, err = create("group-none")
	wantCode(t, err, codes.InvalidArgument, "source_volume_ids is required")

	resp, err := create("group-1", ids...)
	if err != nil {
		t.Fatal(err)
	}
	g := resp.GetGroupSnapshot()
	if g.GetGroupSnapshotId() != fastKey+"/group-group-1" || len(g.GetSnapshots()) != 2 || !g.GetReadyToUse() {
		t.Fatalf("CreateVolumeGroupSnapshot = %v", g)
	}
	var members []string
	for i, s := range g.GetSnapshots() {
		if s.GetGroupSnapshotId() != g.GetGroupSnapshotId() || s.GetSourceVolumeId() != ids[i] {
			t.Fatalf("member %d = %v; want a snapshot of %s in group %s", i, s, ids[i], g.GetGroupSnapshotId())
		}
		members = append(members, s.GetSnapshotId())
	}
	again, err := create("group-1", ids...)
	if err != nil || again.GetGroupSnapshot().GetGroupSnapshotId() != g.GetGroupSnapshotId() {
		t.Fatalf("a repeated CreateVolumeGroupSnapshot = %v, %v", again, err)
	}
	_, err = create("group-1", ids[0])
	wantCode(t, err, codes.AlreadyExists)

	get := func(id string, snaps ...string) (*csi.GetVolumeGroupSnapshotResponse, error) {
		return call(e, "/csi.v1.GroupController/GetVolumeGroupSnapshot", gs.GetVolumeGroupSnapshot,
			&csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: id, SnapshotIds: snaps})
	}
	if got, err := get(g.GetGroupSnapshotId(), members...); err != nil || len(got.GetGroupSnapshot().GetSnapshots()) != 2 {
		t.Fatalf("GetVolumeGroupSnapshot = %v, %v", got, err)
	}
	_, err = get(g.GetGroupSnapshotId(), members[0])
	wantCode(t, err, codes.InvalidArgument, "are not the members")
	_, err = get(fastKey + "/group-nope")
	wantCode(t, err, codes.NotFound)

	del := func(id string) error {
		_, err := call(e, "/csi.v1.GroupController/DeleteVolumeGroupSnapshot", gs.DeleteVolumeGroupSnapshot,
			&csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: id})
		return err
	}
	for range 2 {
		if err := del(g.GetGroupSnapshotId()); err != nil {
			t.Fatalf("DeleteVolumeGroupSnapshot: %v", err)
		}
	}
	if err := del("not a spindle id"); err != nil {
		t.Fatalf("DeleteVolumeGroupSnapshot of a foreign ID: %v", err)
	}
	_, err = get(g.GetGroupSnapshotId())
	wantCode(t, err, codes.NotFound)
}
