package controller

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// Snapshot IDs have the volume ID format, "<backend>/<instance>/<snapshot>";
// the snapshot part is in the store's own namespace, apart from volumes.

// Snapshot describes a snapshot as the CSI services answer it.
type Snapshot struct {
	ID             string
	SourceVolumeID string
	SizeBytes      int64
	CreatedAt      time.Time
	ReadyToUse     bool
}

// snapshotter returns the instance serving a snapshot ID and its snapshot
// role, or an error naming why there is none.
func (c *Controller) snapshotter(id volumeid.ID) (*backend.Instance, backend.Snapshotter, error) {
	inst, err := c.instances.Serving(id)
	if err != nil {
		return nil, nil, err
	}
	if inst.Snapshots == nil {
		return nil, nil, errdefs.InvalidArgument("backend %s takes no snapshots", inst.Key())
	}
	return inst, inst.Snapshots, nil
}

func describeSnapshot(inst *backend.Instance, snap *backend.Snapshot) Snapshot {
	return Snapshot{
		ID:             inst.Key() + "/" + snap.ID,
		SourceVolumeID: inst.Key() + "/" + snap.SourceImageID,
		SizeBytes:      snap.SizeBytes,
		CreatedAt:      snap.CreatedAt,
		ReadyToUse:     snap.ReadyToUse,
	}
}

// CreateSnapshot snapshots the volume source under name, or returns the
// snapshot made under that name before if it is of the same volume. An
// encrypted volume's snapshot gets its own wrap of the volume's key.
func (c *Controller) CreateSnapshot(ctx context.Context, name string, source volumeid.ID, params map[string]string, accessibility *Accessibility) (*Snapshot, error) {
	inst, snaps, err := c.snapshotter(source)
	if err != nil {
		return nil, err
	}
	own, err := snapshotParameters(inst, source.Image, params)
	if err != nil {
		return nil, err
	}
	if err := c.checkAccessibility(inst, accessibility, "accessibility_requirements"); err != nil {
		return nil, err
	}
	release, err := c.locks.Acquire("snapshot/"+name, "snapshot name "+name)
	if err != nil {
		return nil, err
	}
	defer release()
	img, err := inst.Store.Get(ctx, source.Image)
	if err != nil {
		return nil, err
	}
	encryption, err := c.snapshotEncryption(ctx, name, img.Encryption)
	if err != nil {
		return nil, err
	}
	snap, err := snaps.CreateSnapshot(ctx, backend.SnapshotSpec{Name: name, SourceImageID: source.Image, Parameters: own, Encryption: encryption})
	if err != nil {
		return nil, err
	}
	s := describeSnapshot(inst, snap)
	return &s, nil
}

// DeleteSnapshot deletes the snapshot id and its key; one already gone is
// deleted.
func (c *Controller) DeleteSnapshot(ctx context.Context, id volumeid.ID) error {
	_, snaps, err := c.snapshotter(id)
	if err != nil {
		return err
	}
	release, err := c.locks.Acquire("snapshot-id/"+id.String(), "snapshot "+id.String())
	if err != nil {
		return err
	}
	defer release()
	// The key first, as DeleteVolume does, and a failed read is the answer.
	snap, err := snaps.GetSnapshot(ctx, id.Image)
	switch {
	case err == nil && snap.Encryption != nil:
		if err := c.forgetKey(ctx, snap.Encryption); err != nil {
			return err
		}
	case err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound:
		return err
	}
	return snaps.DeleteSnapshot(ctx, id.Image)
}

// GetSnapshot describes the snapshot id.
func (c *Controller) GetSnapshot(ctx context.Context, id volumeid.ID) (*Snapshot, error) {
	inst, snaps, err := c.snapshotter(id)
	if err != nil {
		return nil, err
	}
	snap, err := snaps.GetSnapshot(ctx, id.Image)
	if err != nil {
		return nil, err
	}
	s := describeSnapshot(inst, snap)
	return &s, nil
}

// ListSnapshots lists every snapshot of every instance that takes them,
// sorted by ID; snapshotID and sourceVolumeID, when set, keep only that
// snapshot or those of that volume (an ID that names nothing keeps none).
func (c *Controller) ListSnapshots(ctx context.Context, snapshotID, sourceVolumeID string) ([]Snapshot, error) {
	var all []Snapshot
	for _, key := range c.instances.Keys() {
		inst := c.instances[key]
		if inst.Snapshots == nil {
			continue
		}
		if snapshotID != "" && !hasInstancePrefix(snapshotID, key) || sourceVolumeID != "" && !hasInstancePrefix(sourceVolumeID, key) {
			continue
		}
		snaps, err := inst.Snapshots.ListSnapshots(ctx)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.ErrUnavailable, err, "list the snapshots of backend %s", key)
		}
		for _, snap := range snaps {
			s := describeSnapshot(inst, snap)
			if snapshotID != "" && s.ID != snapshotID || sourceVolumeID != "" && s.SourceVolumeID != sourceVolumeID {
				continue
			}
			all = append(all, s)
		}
	}
	slices.SortFunc(all, func(a, b Snapshot) int { return strings.Compare(a.ID, b.ID) })
	return all, nil
}

func hasInstancePrefix(id, instanceKey string) bool {
	return strings.HasPrefix(id, instanceKey+"/")
}
