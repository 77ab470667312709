package driver

import (
	"context"
	"sort"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// Snapshot IDs have the volume ID format, "<backend>/<instance>/<snapshot>";
// the snapshot part is in the store's own namespace, apart from volumes.

// snapshotter returns the instance serving a snapshot ID and its snapshot
// role, or an error naming why there is none.
func (d *Driver) snapshotter(id volumeid.ID) (*backend.Instance, backend.Snapshotter, error) {
	inst, err := d.instanceFor(id)
	if err != nil {
		return nil, nil, err
	}
	if inst.Snapshots == nil {
		return nil, nil, errdefs.InvalidArgument("backend %s takes no snapshots", inst.Key())
	}
	return inst, inst.Snapshots, nil
}

// csiSnapshot describes a snapshot. It leaves out the optional (alpha)
// accessible_topology: a snapshot is where its source volume is, which the
// volume already says, and csi-sanity v5.6.0 compares a reported topology
// with reflect-based equality that a protobuf message never passes after a
// round trip (its size cache differs), failing every driver that fills it.
func (d *Driver) csiSnapshot(inst *backend.Instance, snap *backend.Snapshot) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     inst.Key() + "/" + snap.ID,
		SourceVolumeId: inst.Key() + "/" + snap.SourceImageID,
		SizeBytes:      snap.SizeBytes,
		CreationTime:   timestamppb.New(snap.CreatedAt),
		ReadyToUse:     snap.ReadyToUse,
	}
}

func (s *controllerService) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if err := validateName("name", req.GetName()); err != nil {
		return nil, err
	}
	source, err := lookupVolumeID("source_volume_id", req.GetSourceVolumeId())
	if err != nil {
		return nil, err
	}
	inst, snaps, err := s.d.snapshotter(source)
	if err != nil {
		return nil, err
	}
	params, err := snapshotParameters(inst, source.Image, req.GetParameters())
	if err != nil {
		return nil, err
	}
	if err := s.d.checkAccessibility(inst, req.GetAccessibilityRequirements(), "accessibility_requirements"); err != nil {
		return nil, err
	}
	release, err := s.d.locks.acquire("snapshot/"+req.GetName(), "snapshot name "+req.GetName())
	if err != nil {
		return nil, err
	}
	defer release()
	img, err := inst.Store.Get(ctx, source.Image)
	if err != nil {
		return nil, err
	}
	encryption, err := s.d.snapshotEncryption(ctx, req.GetName(), img.Encryption)
	if err != nil {
		return nil, err
	}
	snap, err := snaps.CreateSnapshot(ctx, backend.SnapshotSpec{Name: req.GetName(), SourceImageID: source.Image, Parameters: params, Encryption: encryption})
	if err != nil {
		return nil, err
	}
	return &csi.CreateSnapshotResponse{Snapshot: s.d.csiSnapshot(inst, snap)}, nil
}

func (s *controllerService) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, errdefs.InvalidArgument("snapshot_id is required")
	}
	id, err := volumeid.Parse(req.GetSnapshotId())
	if err != nil {
		// No Spindle snapshot has this ID: nothing to delete (see DeleteVolume).
		s.d.log.Warn("DeleteSnapshot of an ID that is not a Spindle snapshot ID; nothing to delete",
			zap.String("snapshotID", req.GetSnapshotId()), zap.Error(err))
		return &csi.DeleteSnapshotResponse{}, nil
	}
	_, snaps, err := s.d.snapshotter(id)
	if err != nil {
		return nil, err
	}
	release, err := s.d.locks.acquire("snapshot-id/"+id.String(), "snapshot "+id.String())
	if err != nil {
		return nil, err
	}
	defer release()
	// The key first, as DeleteVolume does, and a failed read is the answer.
	snap, err := snaps.GetSnapshot(ctx, id.Image)
	switch {
	case err == nil && snap.Encryption != nil:
		if err := s.d.forgetKey(ctx, snap.Encryption); err != nil {
			return nil, err
		}
	case err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound:
		return nil, err
	}
	if err := snaps.DeleteSnapshot(ctx, id.Image); err != nil {
		return nil, err
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

func (s *controllerService) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, errdefs.InvalidArgument("snapshot_id is required")
	}
	id, err := volumeid.Parse(req.GetSnapshotId())
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrNotFound, err, "snapshot_id %q names no Spindle snapshot", req.GetSnapshotId())
	}
	inst, snaps, err := s.d.snapshotter(id)
	if err != nil {
		return nil, err
	}
	snap, err := snaps.GetSnapshot(ctx, id.Image)
	if err != nil {
		return nil, err
	}
	return &csi.GetSnapshotResponse{Snapshot: s.d.csiSnapshot(inst, snap)}, nil
}

// ListSnapshots lists every snapshot, or those of one source volume, or the
// one snapshot asked for; an ID that names nothing gives an empty list, as
// the spec asks, not an error.
func (s *controllerService) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	type entry struct {
		id   string
		inst *backend.Instance
		snap *backend.Snapshot
	}
	var all []entry
	for _, key := range s.d.instanceKeys() {
		inst := s.d.instances[key]
		if inst.Snapshots == nil {
			continue
		}
		if want := req.GetSnapshotId(); want != "" && !hasInstancePrefix(want, key) {
			continue
		}
		if want := req.GetSourceVolumeId(); want != "" && !hasInstancePrefix(want, key) {
			continue
		}
		snaps, err := inst.Snapshots.ListSnapshots(ctx)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.ErrUnavailable, err, "list the snapshots of backend %s", key)
		}
		for _, snap := range snaps {
			e := entry{id: key + "/" + snap.ID, inst: inst, snap: snap}
			if want := req.GetSnapshotId(); want != "" && e.id != want {
				continue
			}
			if want := req.GetSourceVolumeId(); want != "" && key+"/"+snap.SourceImageID != want {
				continue
			}
			all = append(all, e)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].id < all[j].id })
	page, next, err := pageOf(s.d, all, func(e entry) string { return e.id }, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListSnapshotsResponse{NextToken: next}
	for _, e := range page {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: s.d.csiSnapshot(e.inst, e.snap)})
	}
	return resp, nil
}

func hasInstancePrefix(id, instanceKey string) bool {
	return len(id) > len(instanceKey) && id[:len(instanceKey)+1] == instanceKey+"/"
}
