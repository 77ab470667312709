package backend

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// FakeGroupSnapshots is a GroupSnapshotter for tests of what lies above the
// backends: it takes a group's members as ordinary snapshots of Snapshots,
// one after the other (no instant is shared), and keeps the groups in
// memory. A group's ID is "group-" and its name.
type FakeGroupSnapshots struct {
	Snapshots Snapshotter

	mu      sync.Mutex
	groups  map[string]*GroupSnapshot
	sources map[string][]string
}

var _ GroupSnapshotter = (*FakeGroupSnapshots)(nil)

// NewFakeGroupSnapshots returns group snapshots over snaps.
func NewFakeGroupSnapshots(snaps Snapshotter) *FakeGroupSnapshots {
	return &FakeGroupSnapshots{Snapshots: snaps, groups: map[string]*GroupSnapshot{}, sources: map[string][]string{}}
}

// CreateGroupSnapshot implements GroupSnapshotter.
func (f *FakeGroupSnapshots) CreateGroupSnapshot(ctx context.Context, spec GroupSnapshotSpec) (*GroupSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := "group-" + spec.Name
	if g, ok := f.groups[id]; ok {
		if !slices.Equal(f.sources[id], spec.SourceImageIDs) {
			return nil, errdefs.AlreadyExists("group snapshot %q exists of other volumes", spec.Name)
		}
		return g, nil
	}
	g := &GroupSnapshot{ID: id, Name: spec.Name, CreatedAt: time.Now().UTC().Truncate(time.Second), ReadyToUse: true}
	for _, src := range spec.SourceImageIDs {
		snap, err := f.Snapshots.CreateSnapshot(ctx, SnapshotSpec{Name: spec.Name + "-" + src, SourceImageID: src})
		if err != nil {
			return nil, err
		}
		g.Snapshots = append(g.Snapshots, snap)
	}
	f.groups[id], f.sources[id] = g, slices.Clone(spec.SourceImageIDs)
	return g, nil
}

// GetGroupSnapshot implements GroupSnapshotter.
func (f *FakeGroupSnapshots) GetGroupSnapshot(_ context.Context, id string) (*GroupSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if g, ok := f.groups[id]; ok {
		return g, nil
	}
	return nil, errdefs.NotFound("group snapshot %s does not exist", id)
}

// DeleteGroupSnapshot implements GroupSnapshotter.
func (f *FakeGroupSnapshots) DeleteGroupSnapshot(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if g, ok := f.groups[id]; ok {
		for _, s := range g.Snapshots {
			if err := f.Snapshots.DeleteSnapshot(ctx, s.ID); err != nil {
				return err
			}
		}
	}
	delete(f.groups, id)
	delete(f.sources, id)
	return nil
}
