package filestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spindle-csi/spindle/internal/atomicfile"
	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// snapshotsDir holds the snapshots, under the same rules as the volumes: the
// image first and the record last on create, the record first on delete.
// A snapshot is an independent copy (a reflink or a sparse copy), so deleting
// its source volume leaves it intact, and it is never attached or written.
const snapshotsDir = "snapshots"

var _ backend.Snapshotter = (*Store)(nil)

// snapshotRecord is the on-disk metadata of one snapshot.
type snapshotRecord struct {
	Version int `json:"version"`
	backend.Snapshot
}

func (s *Store) snapshotImagePath(id string) string {
	return filepath.Join(s.dir, snapshotsDir, id+imageSuffix)
}

func (s *Store) snapshotMetaPath(id string) string {
	return filepath.Join(s.dir, snapshotsDir, id+metaSuffix)
}

// CreateSnapshot implements backend.Snapshotter. The copy is a point-in-time
// copy or is refused: see copy.go. Parameters are not kept: the store has
// none to offer, and the external-snapshotter may add its own metadata keys.
func (s *Store) CreateSnapshot(ctx context.Context, spec backend.SnapshotSpec) (*backend.Snapshot, error) {
	if spec.Name == "" {
		return nil, errdefs.InvalidArgument("a snapshot needs a name")
	}
	if err := validID(spec.SourceImageID); err != nil {
		return nil, err
	}
	id := SnapshotIDForName(spec.Name)
	var out *backend.Snapshot
	err := s.withLock(ctx, func() error {
		rec, err := s.readSnapshot(id)
		switch {
		case err == nil:
			if rec.Name != spec.Name {
				return errdefs.AlreadyExists("snapshot %s belongs to snapshot name %q, not %q", id, rec.Name, spec.Name)
			}
			if rec.SourceImageID != spec.SourceImageID {
				return errdefs.AlreadyExists("snapshot %q already exists and is of volume %s, not %s", spec.Name, rec.SourceImageID, spec.SourceImageID)
			}
			if _, err := os.Stat(s.snapshotImagePath(id)); err != nil {
				return errdefs.Wrap(errdefs.ErrPrecondition, err, "snapshot %q exists in %s but its image file is missing; its data is gone, delete the snapshot", spec.Name, s.name)
			}
			snap := rec.Snapshot
			out = &snap
			return nil
		case !errors.Is(err, errdefs.ErrNotFound):
			return err
		}
		// No metadata: an image file here is the leftover of an interrupted create or delete.
		if err := removeIfExists(s.snapshotImagePath(id)); err != nil {
			return err
		}
		src, err := s.volumeSource(spec.SourceImageID)
		if err != nil {
			return err
		}
		snap := backend.Snapshot{
			ID:            id,
			Name:          spec.Name,
			SourceImageID: spec.SourceImageID,
			SizeBytes:     src.SizeBytes,
			CreatedAt:     time.Now().UTC().Truncate(time.Second),
			ReadyToUse:    true,
			AccessType:    src.AccessType,
			FsType:        src.FsType,
			Formatted:     src.formatted,
			Encryption:    spec.Encryption.Clone(),
		}
		if _, err := s.copyImage(ctx, s.snapshotImagePath(id), src, src.SizeBytes); err != nil {
			return err
		}
		if err := s.writeSnapshot(&snapshotRecord{Snapshot: snap}); err != nil {
			err = spaceError(err, "write metadata of snapshot %s", id)
			if cleanupErr := s.removeSnapshotFiles(id); cleanupErr != nil {
				err = errors.Join(err, fmt.Errorf("cleanup: %w", cleanupErr))
			}
			return err
		}
		out = &snap
		return nil
	})
	return out, err
}

// DeleteSnapshot implements backend.Snapshotter. Volumes restored from the
// snapshot are copies, so nothing depends on it.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	return s.withLock(ctx, func() error { return s.removeSnapshotFiles(id) })
}

// removeSnapshotFiles removes the metadata first, then the image.
func (s *Store) removeSnapshotFiles(id string) error {
	if err := atomicfile.Remove(s.snapshotMetaPath(id)); err != nil {
		return fmt.Errorf("remove metadata of snapshot %s: %w", id, err)
	}
	if err := removeIfExists(s.snapshotImagePath(id)); err != nil {
		return fmt.Errorf("remove snapshot image %s: %w", id, err)
	}
	return nil
}

// GetSnapshot implements backend.Snapshotter.
func (s *Store) GetSnapshot(_ context.Context, id string) (*backend.Snapshot, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	rec, err := s.readSnapshot(id)
	if err != nil {
		return nil, err
	}
	return &rec.Snapshot, nil
}

// ListSnapshots implements backend.Snapshotter: every snapshot, sorted by ID.
func (s *Store) ListSnapshots(context.Context) ([]*backend.Snapshot, error) {
	entries, err := os.ReadDir(filepath.Join(s.dir, snapshotsDir))
	if err != nil {
		return nil, err
	}
	var out []*backend.Snapshot
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, metaSuffix) || strings.HasPrefix(name, ".") {
			continue
		}
		rec, err := s.readSnapshot(strings.TrimSuffix(name, metaSuffix))
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, &rec.Snapshot)
	}
	slices.SortFunc(out, func(a, b *backend.Snapshot) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

func (s *Store) readSnapshot(id string) (*snapshotRecord, error) {
	path := s.snapshotMetaPath(id)
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, errdefs.NotFound("snapshot %s does not exist in %s", id, s.name)
	}
	if err != nil {
		return nil, err
	}
	var rec snapshotRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("metadata %s is corrupt: %w", path, err)
	}
	if rec.Version != recordVersion {
		return nil, fmt.Errorf("metadata %s has version %d; this Spindle reads version %d", path, rec.Version, recordVersion)
	}
	return &rec, nil
}

func (s *Store) writeSnapshot(rec *snapshotRecord) error {
	rec.Version = recordVersion
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(s.snapshotMetaPath(rec.ID), append(data, '\n'), 0o600)
}

// sweepSnapshots is sweep for the snapshots directory: temporaries and
// snapshot images without a record go.
func (s *Store) sweepSnapshots() error {
	dir := filepath.Join(s.dir, snapshotsDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, atomicfile.TempPrefix):
			errs = append(errs, removeIfExists(filepath.Join(dir, name)))
		case strings.HasSuffix(name, imageSuffix):
			id := strings.TrimSuffix(name, imageSuffix)
			if _, err := s.readSnapshot(id); errors.Is(err, errdefs.ErrNotFound) {
				errs = append(errs, removeIfExists(s.snapshotImagePath(id)))
			}
		}
	}
	return errors.Join(errs...)
}
