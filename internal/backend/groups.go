package backend

import (
	"context"
	"time"
)

// GroupSnapshot is a set of snapshots of several volumes of one instance,
// all of one instant: crash-consistent together (a database's data and its
// write-ahead log on two volumes).
type GroupSnapshot struct {
	ID   string `json:"id"`   // the store's ID, in the snapshot ID namespace
	Name string `json:"name"` // the CSI name; creation is idempotent by name
	// Snapshots are the members, one per source volume, in the order of
	// GroupSnapshotSpec.SourceImageIDs; each is a snapshot of this store
	// that volumes can be restored from.
	Snapshots  []*Snapshot `json:"snapshots"`
	CreatedAt  time.Time   `json:"createdAt"`
	ReadyToUse bool        `json:"readyToUse"`
}

// GroupSnapshotSpec is what CreateVolumeGroupSnapshot asks for.
type GroupSnapshotSpec struct {
	Name           string
	SourceImageIDs []string
	Parameters     map[string]string
}

// GroupSnapshotter is implemented by stores that can snapshot several
// volumes at one instant. A store that cannot leaves Instance.GroupSnapshots
// nil, and the driver refuses group snapshots of its volumes naming it.
type GroupSnapshotter interface {
	// CreateGroupSnapshot snapshots the source images together, or returns
	// the existing group snapshot of that name when it has the same
	// sources (ErrAlreadyExists when not). A failed call leaves nothing
	// behind.
	CreateGroupSnapshot(ctx context.Context, spec GroupSnapshotSpec) (*GroupSnapshot, error)
	// GetGroupSnapshot returns it or ErrNotFound.
	GetGroupSnapshot(ctx context.Context, groupSnapshotID string) (*GroupSnapshot, error)
	// DeleteGroupSnapshot removes it and its member snapshots; a missing
	// one is success.
	DeleteGroupSnapshot(ctx context.Context, groupSnapshotID string) error
}
