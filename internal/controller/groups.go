package controller

import (
	"context"
	"slices"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// Volume group snapshots: several volumes of one backend instance
// snapshotted at one instant (backend.GroupSnapshotter). Group snapshot IDs
// have the volume ID format, "<backend>/<instance>/<group>"; their members
// are ordinary snapshots of the instance.

// GroupSnapshot describes a group snapshot and its members.
type GroupSnapshot struct {
	ID         string
	CreatedAt  time.Time
	ReadyToUse bool
	Snapshots  []Snapshot
}

// GroupSnapshots reports whether any instance takes group snapshots: the
// capability is reported only then.
func (c *Controller) GroupSnapshots() bool {
	for _, inst := range c.instances {
		if inst.GroupSnapshots != nil {
			return true
		}
	}
	return false
}

// groupSnapshotter returns the instance serving id and its group snapshot
// role, or an error naming the backend that has none.
func (c *Controller) groupSnapshotter(id volumeid.ID) (*backend.Instance, backend.GroupSnapshotter, error) {
	inst, err := c.instances.Serving(id)
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

func describeGroupSnapshot(inst *backend.Instance, g *backend.GroupSnapshot) *GroupSnapshot {
	out := &GroupSnapshot{ID: inst.Key() + "/" + g.ID, CreatedAt: g.CreatedAt, ReadyToUse: g.ReadyToUse}
	for _, snap := range g.Snapshots {
		out.Snapshots = append(out.Snapshots, describeSnapshot(inst, snap))
	}
	return out
}

// CreateGroupSnapshot snapshots the volumes sources, all of one backend
// instance and each named once, at one instant under name. Spindle takes
// no group snapshot parameters: the sidecar's keys are all params may hold.
func (c *Controller) CreateGroupSnapshot(ctx context.Context, name string, sources []volumeid.ID, params map[string]string) (*GroupSnapshot, error) {
	var inst *backend.Instance
	var images []string
	for i, id := range sources {
		if inst != nil && id.InstanceKey() != inst.Key() {
			return nil, errdefs.InvalidArgument("source_volume_ids: %s is on backend %s and %s on %s; a group snapshot's volumes must be on one backend instance",
				sources[0], inst.Key(), id, id.InstanceKey())
		}
		if slices.Contains(images, id.Image) {
			return nil, errdefs.InvalidArgument("source_volume_ids[%d]: %s is named twice", i, id)
		}
		if inst == nil {
			var err error
			if inst, err = c.instances.Serving(id); err != nil {
				return nil, err
			}
		}
		images = append(images, id.Image)
	}
	if inst == nil {
		return nil, errdefs.InvalidArgument("source_volume_ids is required")
	}
	groups, err := groupsOf(inst)
	if err != nil {
		return nil, err
	}
	for k := range params {
		if !isProvisionerKey(k) {
			return nil, errdefs.InvalidArgument("parameters: unknown key %q (Spindle takes no group snapshot parameters)", k)
		}
	}
	release, err := c.locks.Acquire("group-snapshot/"+name, "group snapshot name "+name)
	if err != nil {
		return nil, err
	}
	defer release()
	g, err := groups.CreateGroupSnapshot(ctx, backend.GroupSnapshotSpec{Name: name, SourceImageIDs: images})
	if err != nil {
		return nil, err
	}
	return describeGroupSnapshot(inst, g), nil
}

// checkMembers fails unless snapshotIDs, when given, are exactly the
// group's members, as the spec asks.
func checkMembers(inst *backend.Instance, g *backend.GroupSnapshot, snapshotIDs []string) error {
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

// GetGroupSnapshot describes the group snapshot id, whose members must be
// snapshotIDs when they are given.
func (c *Controller) GetGroupSnapshot(ctx context.Context, id volumeid.ID, snapshotIDs []string) (*GroupSnapshot, error) {
	inst, groups, err := c.groupSnapshotter(id)
	if err != nil {
		return nil, err
	}
	g, err := groups.GetGroupSnapshot(ctx, id.Image)
	if err != nil {
		return nil, err
	}
	if err := checkMembers(inst, g, snapshotIDs); err != nil {
		return nil, err
	}
	return describeGroupSnapshot(inst, g), nil
}

// DeleteGroupSnapshot deletes the group snapshot id, whose members must be
// snapshotIDs when they are given; one already gone is deleted.
func (c *Controller) DeleteGroupSnapshot(ctx context.Context, id volumeid.ID, snapshotIDs []string) error {
	inst, groups, err := c.groupSnapshotter(id)
	if err != nil {
		return err
	}
	release, err := c.locks.Acquire("group-snapshot-id/"+id.String(), "group snapshot "+id.String())
	if err != nil {
		return err
	}
	defer release()
	g, err := groups.GetGroupSnapshot(ctx, id.Image)
	switch {
	case err == nil:
		if err := checkMembers(inst, g, snapshotIDs); err != nil {
			return err
		}
	case errdefs.KindOf(err) == errdefs.ErrNotFound:
		return nil
	default:
		return err // an error of no kind too: not "absent"
	}
	return groups.DeleteGroupSnapshot(ctx, id.Image)
}
