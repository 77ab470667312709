package driver

import (
	"context"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// The CSI GroupController: volume group snapshots, several volumes of one
// backend instance snapshotted at one instant (backend.GroupSnapshotter).
// Group snapshot IDs have the volume ID format, "<backend>/<instance>/<group>";
// their members are ordinary snapshots of the instance.

type groupControllerService struct {
	csi.UnimplementedGroupControllerServer
	d *Driver
}

// groupSnapshots reports whether any instance takes group snapshots: the
// capability is reported only then.
func (d *Driver) groupSnapshots() bool {
	for _, inst := range d.instances {
		if inst.GroupSnapshots != nil {
			return true
		}
	}
	return false
}

// groupSnapshotter returns the instance serving id and its group snapshot
// role, or an error naming the backend that has none.
func (d *Driver) groupSnapshotter(id volumeid.ID) (*backend.Instance, backend.GroupSnapshotter, error) {
	inst, err := d.instanceFor(id)
	if err != nil {
		return nil, nil, err
	}
	groups, err := groupsOf(inst)
	return inst, groups, err
}

func groupsOf(inst *backend.Instance) (backend.GroupSnapshotter, error) {
	if inst.GroupSnapshots == nil {
		return nil, errdefs.InvalidArgument("backend %s cannot take group snapshots: it has no way to snapshot several volumes at one instant (docs/volumes.md says which backends can)", inst.Key())
	}
	return inst.GroupSnapshots, nil
}

func (s *groupControllerService) GroupControllerGetCapabilities(context.Context, *csi.GroupControllerGetCapabilitiesRequest) (*csi.GroupControllerGetCapabilitiesResponse, error) {
	resp := &csi.GroupControllerGetCapabilitiesResponse{}
	if s.d.groupSnapshots() {
		resp.Capabilities = append(resp.Capabilities, &csi.GroupControllerServiceCapability{
			Type: &csi.GroupControllerServiceCapability_Rpc{Rpc: &csi.GroupControllerServiceCapability_RPC{
				Type: csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT,
			}},
		})
	}
	return resp, nil
}

func (d *Driver) csiGroupSnapshot(inst *backend.Instance, g *backend.GroupSnapshot) *csi.VolumeGroupSnapshot {
	out := &csi.VolumeGroupSnapshot{
		GroupSnapshotId: inst.Key() + "/" + g.ID,
		CreationTime:    timestamppb.New(g.CreatedAt),
		ReadyToUse:      g.ReadyToUse,
	}
	for _, snap := range g.Snapshots {
		c := d.csiSnapshot(inst, snap)
		c.GroupSnapshotId = out.GroupSnapshotId
		out.Snapshots = append(out.Snapshots, c)
	}
	return out
}

func (s *groupControllerService) CreateVolumeGroupSnapshot(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	if err := validateName("name", req.GetName()); err != nil {
		return nil, err
	}
	if len(req.GetSourceVolumeIds()) == 0 {
		return nil, errdefs.InvalidArgument("source_volume_ids is required")
	}
	var inst *backend.Instance
	var images []string
	for i, raw := range req.GetSourceVolumeIds() {
		id, err := lookupVolumeID("source_volume_ids", raw)
		if err != nil {
			return nil, err
		}
		if inst != nil && id.InstanceKey() != inst.Key() {
			return nil, errdefs.InvalidArgument("source_volume_ids: %s is on backend %s and %s on %s; a group snapshot's volumes must be on one backend instance",
				req.GetSourceVolumeIds()[0], inst.Key(), raw, id.InstanceKey())
		}
		if slices.Contains(images, id.Image) {
			return nil, errdefs.InvalidArgument("source_volume_ids[%d]: %s is named twice", i, raw)
		}
		if inst == nil {
			if inst, err = s.d.instanceFor(id); err != nil {
				return nil, err
			}
		}
		images = append(images, id.Image)
	}
	groups, err := groupsOf(inst)
	if err != nil {
		return nil, err
	}
	for k := range req.GetParameters() {
		if !isProvisionerKey(k) {
			return nil, errdefs.InvalidArgument("parameters: unknown key %q (Spindle takes no group snapshot parameters)", k)
		}
	}
	release, err := s.d.locks.acquire("group-snapshot/"+req.GetName(), "group snapshot name "+req.GetName())
	if err != nil {
		return nil, err
	}
	defer release()
	g, err := groups.CreateGroupSnapshot(ctx, backend.GroupSnapshotSpec{Name: req.GetName(), SourceImageIDs: images})
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeGroupSnapshotResponse{GroupSnapshot: s.d.csiGroupSnapshot(inst, g)}, nil
}

// groupSnapshotID parses a group snapshot ID.
func groupSnapshotID(raw string) (volumeid.ID, error) {
	if raw == "" {
		return volumeid.ID{}, errdefs.InvalidArgument("group_snapshot_id is required")
	}
	id, err := volumeid.Parse(raw)
	if err != nil {
		return volumeid.ID{}, errdefs.Wrap(errdefs.ErrNotFound, err, "group_snapshot_id %.64q names no Spindle group snapshot", raw)
	}
	return id, nil
}

// checkMembers fails unless snapshotIDs, when given, are exactly the
// group's members, as the spec asks.
func (d *Driver) checkMembers(inst *backend.Instance, g *backend.GroupSnapshot, snapshotIDs []string) error {
	if len(snapshotIDs) == 0 {
		return nil
	}
	var have []string
	for _, snap := range g.Snapshots {
		have = append(have, inst.Key()+"/"+snap.ID)
	}
	want := slices.Clone(snapshotIDs)
	slices.Sort(have)
	slices.Sort(want)
	if !slices.Equal(have, want) {
		return errdefs.InvalidArgument("snapshot_ids %v are not the members of group snapshot %s/%s, %v", snapshotIDs, inst.Key(), g.ID, have)
	}
	return nil
}

func (s *groupControllerService) GetVolumeGroupSnapshot(ctx context.Context, req *csi.GetVolumeGroupSnapshotRequest) (*csi.GetVolumeGroupSnapshotResponse, error) {
	id, err := groupSnapshotID(req.GetGroupSnapshotId())
	if err != nil {
		return nil, err
	}
	inst, groups, err := s.d.groupSnapshotter(id)
	if err != nil {
		return nil, err
	}
	g, err := groups.GetGroupSnapshot(ctx, id.Image)
	if err != nil {
		return nil, err
	}
	if err := s.d.checkMembers(inst, g, req.GetSnapshotIds()); err != nil {
		return nil, err
	}
	return &csi.GetVolumeGroupSnapshotResponse{GroupSnapshot: s.d.csiGroupSnapshot(inst, g)}, nil
}

func (s *groupControllerService) DeleteVolumeGroupSnapshot(ctx context.Context, req *csi.DeleteVolumeGroupSnapshotRequest) (*csi.DeleteVolumeGroupSnapshotResponse, error) {
	if req.GetGroupSnapshotId() == "" {
		return nil, errdefs.InvalidArgument("group_snapshot_id is required")
	}
	id, err := volumeid.Parse(req.GetGroupSnapshotId())
	if err != nil {
		// No Spindle group snapshot has this ID: nothing to delete.
		s.d.log.Warn("DeleteVolumeGroupSnapshot of an ID that is not a Spindle group snapshot ID; nothing to delete",
			zap.String("groupSnapshotID", req.GetGroupSnapshotId()), zap.Error(err))
		return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
	}
	inst, groups, err := s.d.groupSnapshotter(id)
	if err != nil {
		return nil, err
	}
	release, err := s.d.locks.acquire("group-snapshot-id/"+id.String(), "group snapshot "+id.String())
	if err != nil {
		return nil, err
	}
	defer release()
	g, err := groups.GetGroupSnapshot(ctx, id.Image)
	switch {
	case err == nil:
		if err := s.d.checkMembers(inst, g, req.GetSnapshotIds()); err != nil {
			return nil, err
		}
	case errdefs.KindOf(err) == errdefs.ErrNotFound:
		return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
	default:
		return nil, err // an error of no kind too: not "absent"
	}
	if err := groups.DeleteGroupSnapshot(ctx, id.Image); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
}
