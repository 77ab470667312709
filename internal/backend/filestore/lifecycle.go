package filestore

import (
	"context"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// List implements backend.ImageStore: every ready image, sorted by ID.
func (s *Store) List(context.Context) ([]*backend.Image, error) {
	recs, err := s.readAll()
	if err != nil {
		return nil, err
	}
	out := make([]*backend.Image, 0, len(recs))
	for _, r := range recs {
		out = append(out, r.Image.Clone())
	}
	// Directory order is by file name, and "a-b.json" sorts before "a.json".
	slices.SortFunc(out, func(a, b *backend.Image) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Expand implements backend.ImageStore. The file grows first, durably, and
// the record second, so an interruption between them leaves a file larger
// than its record: harmless, since nothing trusts the file's size over the
// record, and the retried Expand writes the record.
func (s *Store) Expand(ctx context.Context, id string, newBytes int64) (*backend.Image, error) {
	return s.Update(ctx, id, func(img *backend.Image) error {
		if grow, err := backend.CheckExpand(id, img.CapacityBytes, newBytes); err != nil {
			return err
		} else if !grow {
			return ErrUnchanged
		}
		if err := s.checkSpace(newBytes - img.CapacityBytes); err != nil {
			return err
		}
		if err := s.growFile(id, newBytes); err != nil {
			return err
		}
		img.CapacityBytes = newBytes
		return nil
	})
}

// growFile makes the image file at least size bytes long, durably. It never
// cuts a file: one already longer is the trace of an interrupted Expand,
// which a node may have seen (a loop device takes the file's size at
// attach) and grown a filesystem into.
func (s *Store) growFile(id string, size int64) error {
	f, err := os.OpenFile(s.ImagePath(id), os.O_WRONLY, 0)
	if os.IsNotExist(err) {
		return errdefs.Wrap(errdefs.ErrPrecondition, err, "volume %s exists in %s but its image file is missing; its data is gone, delete the volume", id, s.name)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() < size {
		if err := f.Truncate(size); err != nil {
			return sizeError(err, size, "grow image %s", id)
		}
	}
	if err := f.Sync(); err != nil {
		return spaceError(err, "sync image %s", id)
	}
	return f.Close()
}

// Modify implements backend.ImageStore: the backend's validator (Options.
// ValidateMutable) decides what is accepted; the store merges and keeps it.
func (s *Store) Modify(ctx context.Context, id string, mutable map[string]string) (*backend.Image, error) {
	if err := s.checkMutable(mutable); err != nil {
		return nil, err
	}
	return s.Update(ctx, id, func(img *backend.Image) error {
		changed := false
		for k, v := range mutable {
			if old, ok := img.MutableParameters[k]; !ok || old != v {
				changed = true
			}
		}
		if !changed {
			return ErrUnchanged
		}
		if img.MutableParameters == nil {
			img.MutableParameters = map[string]string{}
		}
		maps.Copy(img.MutableParameters, mutable)
		return nil
	})
}

// Capacity implements backend.ImageStore. Images are sparse, so the free
// space of the pool filesystem is what a new image can have now; with
// MaxProvisionedBytes, what the cap still allows, when that is less.
func (s *Store) Capacity(context.Context) (backend.Capacity, error) {
	avail, err := s.FreeBytes()
	if err != nil {
		return backend.Capacity{}, err
	}
	if s.max > 0 {
		used, err := s.ProvisionedBytes()
		if err != nil {
			return backend.Capacity{}, err
		}
		avail = min(avail, max(s.max-used, 0))
	}
	return backend.Capacity{AvailableBytes: avail, MaximumVolumeBytes: avail}, nil
}

var _ backend.EncryptionKeeper = (*Store)(nil)

// SetEncryption implements backend.EncryptionKeeper.
func (s *Store) SetEncryption(ctx context.Context, id string, e *backend.Encryption) error {
	_, err := s.Update(ctx, id, func(img *backend.Image) error {
		img.Encryption = e.Clone()
		return nil
	})
	return err
}
