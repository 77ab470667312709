// Package filestore is an image store of sparse files in a pool directory:
// the loop backend's store, and the iSCSI backend's on the target host.
//
// Layout of a pool directory:
//
//	<id>.img                the sparse image
//	<id>.json               its metadata (backend.Image plus a state), replaced atomically
//	snapshots/<id>.img      a snapshot: an independent copy of a volume's image
//	snapshots/<id>.json     its metadata (backend.Snapshot)
//	.nodes/<node>.json      node plugins that registered with this pool
//	.spindle.lock           flock'ed around every read-modify-write of metadata
//
// Every metadata change happens under the pool lock, which is an flock and so
// works between the controller and node plugins sharing the directory.
// Creation makes the image first and writes its metadata last; deletion
// removes the metadata first and the image second. The metadata is what
// makes a volume exist, so an image file without metadata is always the
// leftover of an interrupted create or delete. Such leftovers (and records
// in the state "creating", which earlier versions wrote first) are removed
// when the ID is next used and whenever a Store is opened. Snapshots follow
// the same rules in their own directory, a namespace separate from volumes.
//
// Copies (clones and snapshots) are reflinks where the pool filesystem can
// make them (xfs with reflink, btrfs) and sparse copies elsewhere; see copy.go
// for why that decides whether a volume in use may be copied.
package filestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/atomicfile"
	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

const (
	imageSuffix = ".img"
	metaSuffix  = ".json"
	lockName    = ".spindle.lock"
	nodesDir    = ".nodes"

	stateCreating = "creating"
	stateReady    = "ready"

	recordVersion = 1

	// lockPoll is how often a busy pool lock is retried.
	lockPoll = 5 * time.Millisecond
	// defaultLockWait bounds the wait for the pool lock when the context has no deadline.
	defaultLockWait = 30 * time.Second
)

// Options configure a Store.
type Options struct {
	// Dir is the pool directory; created (0750) when missing.
	Dir string
	// Name is the instance key, e.g. "loop/default", for messages.
	Name string
	// MaxProvisionedBytes caps the sum of all images' sizes; 0 means only
	// the pool filesystem's free space limits a new image. Snapshots are
	// not counted: a snapshot's copy is checked against the free space.
	MaxProvisionedBytes int64
	// ValidateMutable checks mutable parameters (Create's
	// spec.MutableParameters, Modify) against what the backend understands,
	// returning an errdefs.ErrInvalidArgument that names the offending key.
	// The store only keeps them; their meaning is the backend's. Nil accepts
	// none: every key is refused.
	ValidateMutable func(map[string]string) error
}

// Store is a pool directory of sparse images.
type Store struct {
	dir             string
	name            string
	max             int64
	validateMutable func(map[string]string) error
}

// record is the on-disk metadata of one image.
type record struct {
	Version int    `json:"version"`
	State   string `json:"state"`
	backend.Image
}

// New opens (creating if needed) the pool directory.
func New(opts Options) (*Store, error) {
	if opts.Dir == "" || !filepath.IsAbs(opts.Dir) {
		return nil, errdefs.InvalidArgument("pool directory %q must be an absolute path", opts.Dir)
	}
	for _, sub := range []string{nodesDir, snapshotsDir} {
		if err := os.MkdirAll(filepath.Join(opts.Dir, sub), 0o750); err != nil {
			return nil, fmt.Errorf("create pool directory: %w", err)
		}
	}
	// The kernel reports a loop device's backing file by its resolved path, so
	// the store works with the resolved path too.
	dir, err := filepath.EvalSymlinks(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("resolve pool directory: %w", err)
	}
	st := &Store{dir: dir, name: opts.Name, max: opts.MaxProvisionedBytes, validateMutable: opts.ValidateMutable}
	ctx, cancel := context.WithTimeout(context.Background(), defaultLockWait)
	defer cancel()
	if err := st.withLock(ctx, st.sweep); err != nil {
		return nil, fmt.Errorf("clean up pool %s: %w", dir, err)
	}
	return st, nil
}

// sweep removes what interrupted creates and deletes left: image files
// without metadata, records that never became ready, and temporary files,
// among the volumes and among the snapshots. It runs under the pool lock,
// which every create and delete holds from start to end, so nothing it
// removes is in use.
func (s *Store) sweep() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return err
	}
	errs := []error{s.sweepSnapshots()}
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, atomicfile.TempPrefix):
			errs = append(errs, removeIfExists(filepath.Join(s.dir, name)))
		case strings.HasSuffix(name, imageSuffix):
			id := strings.TrimSuffix(name, imageSuffix)
			rec, err := s.read(id)
			switch {
			case errors.Is(err, errdefs.ErrNotFound):
				errs = append(errs, removeIfExists(s.ImagePath(id)))
			case err == nil && rec.State != stateReady:
				errs = append(errs, s.removeFiles(id))
			}
		}
	}
	return errors.Join(errs...)
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// Dir is the resolved pool directory.
func (s *Store) Dir() string { return s.dir }

// ImagePath is where the image file of id lives.
func (s *Store) ImagePath(id string) string { return filepath.Join(s.dir, id+imageSuffix) }

// ImageIDOf is the inverse of ImagePath: the image ID whose file is path,
// and false for any path that is not an image file of this pool.
func (s *Store) ImageIDOf(path string) (string, bool) {
	if filepath.Dir(path) != s.dir {
		return "", false
	}
	id, ok := strings.CutSuffix(filepath.Base(path), imageSuffix)
	if !ok || validID(id) != nil {
		return "", false
	}
	return id, true
}

func (s *Store) metaPath(id string) string { return filepath.Join(s.dir, id+metaSuffix) }

var plainNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
var hashedIDRe = regexp.MustCompile(`^vol-[0-9a-f]{40}$`)
var hashedSnapshotIDRe = regexp.MustCompile(`^snap-[0-9a-f]{40}$`)

// ImageIDForName maps a CSI name to an image ID, deterministically, so that a
// retried CreateVolume finds its image without a name index. A short name in
// a safe alphabet (every Kubernetes "pvc-<uid>") is used as it is, so IDs stay
// readable; anything else is hashed.
func ImageIDForName(name string) string { return idForName(name, "vol-", hashedIDRe) }

// SnapshotIDForName is ImageIDForName for snapshots ("snapshot-<uid>" kept,
// anything else "snap-<sha>"). Snapshots live in their own directory, so a
// snapshot and a volume may share an ID.
func SnapshotIDForName(name string) string { return idForName(name, "snap-", hashedSnapshotIDRe) }

// idForName keeps a plain name unless it looks like a hash itself, which
// would let it collide with the hash of another name.
func idForName(name, prefix string, hashed *regexp.Regexp) string {
	if plainNameRe.MatchString(name) && !strings.Contains(name, "..") && !hashed.MatchString(name) {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return prefix + hex.EncodeToString(sum[:20])
}

// validID guards every path built from an image ID (the driver validated the
// volume ID already; this keeps the store safe on its own).
func validID(id string) error {
	if id == "" || strings.ContainsAny(id, "/\x00") || strings.HasPrefix(id, ".") || strings.Contains(id, "..") {
		return errdefs.InvalidArgument("image ID %q is not a valid file image name", id)
	}
	return nil
}

// Create implements backend.ImageStore. With spec.Source the image is a
// copy of a snapshot or of another volume (see createCopy).
func (s *Store) Create(ctx context.Context, spec backend.VolumeSpec) (*backend.Image, error) {
	id := ImageIDForName(spec.Name)
	if spec.CapacityBytes <= 0 {
		return nil, errdefs.InvalidArgument("capacity must be positive, got %d", spec.CapacityBytes)
	}
	if err := s.checkMutable(spec.MutableParameters); err != nil {
		return nil, err
	}
	if err := validSource(spec.Source); err != nil {
		return nil, err
	}
	var out *backend.Image
	err := s.withLock(ctx, func() error {
		rec, err := s.read(id)
		switch {
		case err == nil && rec.State == stateReady:
			if rec.Name != spec.Name {
				return errdefs.AlreadyExists("image %s belongs to volume name %q, not %q", id, rec.Name, spec.Name)
			}
			if err := backend.Compatible(&rec.Image, spec); err != nil {
				return err
			}
			// Answering "created" for a volume whose data is gone would
			// hand Kubernetes an empty disk under a name it trusts.
			if _, err := os.Stat(s.ImagePath(id)); err != nil {
				return errdefs.Wrap(errdefs.ErrPrecondition, err, "volume %q exists in %s but its image file is missing; its data is gone, delete the volume", spec.Name, s.name)
			}
			out = rec.Image.Clone()
			return nil
		case err == nil:
			// An interrupted create: start again from nothing.
			if err := s.removeFiles(id); err != nil {
				return err
			}
		case !errors.Is(err, errdefs.ErrNotFound):
			return err
		default:
			// No metadata: an image file here is the leftover of an interrupted delete.
			if err := removeIfExists(s.ImagePath(id)); err != nil {
				return err
			}
		}
		img := backend.Image{
			ID:                id,
			Name:              spec.Name,
			CapacityBytes:     spec.CapacityBytes,
			AccessType:        spec.AccessType,
			FsType:            spec.FsType,
			Parameters:        maps.Clone(spec.Parameters),
			MutableParameters: maps.Clone(spec.MutableParameters),
			CreatedAt:         time.Now().UTC().Truncate(time.Second),
			Encryption:        spec.Encryption.Clone(),
		}
		if spec.Source != nil {
			img, err := s.createCopy(ctx, img, spec)
			if err != nil {
				return err
			}
			out = img
			return nil
		}
		if err := s.checkSpace(spec.CapacityBytes); err != nil {
			return err
		}
		if err := s.allocate(&img); err != nil {
			// Leave nothing behind: not the image, not the record.
			if cleanupErr := s.removeFiles(id); cleanupErr != nil {
				err = errors.Join(err, fmt.Errorf("cleanup: %w", cleanupErr))
			}
			return err
		}
		out = img.Clone()
		return nil
	})
	return out, err
}

// checkMutable runs the backend's validation of mutable parameters; without
// one, no key is understood.
func (s *Store) checkMutable(mutable map[string]string) error {
	if len(mutable) == 0 {
		return nil
	}
	if s.validateMutable == nil {
		return errdefs.InvalidArgument("mutable parameter %q is not supported by %s (it supports none)", slices.Sorted(maps.Keys(mutable))[0], s.name)
	}
	err := s.validateMutable(mutable)
	if err != nil && errdefs.KindOf(err) == nil {
		err = errdefs.Wrap(errdefs.ErrInvalidArgument, err, "mutable parameters of %s", s.name)
	}
	return err
}

// allocate makes the sparse file, durably, then the record that makes it a volume.
func (s *Store) allocate(img *backend.Image) error {
	f, err := os.OpenFile(s.ImagePath(img.ID), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return spaceError(err, "create image %s", img.ID)
	}
	err = f.Truncate(img.CapacityBytes)
	if err == nil {
		err = f.Sync()
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return sizeError(err, img.CapacityBytes, "size image %s", img.ID)
	}
	if err := s.write(&record{State: stateReady, Image: *img}); err != nil {
		return spaceError(err, "write metadata of %s", img.ID)
	}
	return nil
}

func spaceError(err error, format string, args ...any) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return errdefs.Wrap(errdefs.ErrExhausted, err, format, args...)
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}

// checkSpace refuses an image the pool cannot hold.
func (s *Store) checkSpace(size int64) error {
	free, err := s.FreeBytes()
	if err != nil {
		return err
	}
	if size > free {
		return errdefs.Exhausted("pool %s has %d bytes free; a %d-byte volume does not fit", s.name, free, size)
	}
	if s.max > 0 {
		used, err := s.ProvisionedBytes()
		if err != nil {
			return err
		}
		if used+size > s.max {
			return errdefs.Exhausted("pool %s has %d of its %d bytes provisioned; a %d-byte volume does not fit", s.name, used, s.max, size)
		}
	}
	return nil
}

// FreeBytes is the space available to new data on the pool filesystem.
func (s *Store) FreeBytes() (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(s.dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", s.dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// ProvisionedBytes is the sum of all images' sizes.
func (s *Store) ProvisionedBytes() (int64, error) {
	recs, err := s.readAll()
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, r := range recs {
		sum += r.CapacityBytes
	}
	return sum, nil
}

// Delete implements backend.ImageStore.
func (s *Store) Delete(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	return s.withLock(ctx, func() error {
		rec, err := s.read(id)
		if errors.Is(err, errdefs.ErrNotFound) {
			if err := os.Remove(s.ImagePath(id)); err != nil && !os.IsNotExist(err) {
				return err
			}
			return nil
		}
		if err != nil {
			return err
		}
		if rec.State == stateReady && len(rec.Attachments) > 0 {
			nodes := make([]string, 0, len(rec.Attachments))
			for _, a := range rec.Attachments {
				nodes = append(nodes, a.NodeID)
			}
			return errdefs.Precondition("volume %s is still published to node(s) %s; unpublish it first", id, strings.Join(nodes, ", "))
		}
		return s.removeFiles(id)
	})
}

// removeFiles removes the metadata first, then the image (see the package comment).
func (s *Store) removeFiles(id string) error {
	if err := atomicfile.Remove(s.metaPath(id)); err != nil {
		return fmt.Errorf("remove metadata of %s: %w", id, err)
	}
	if err := os.Remove(s.ImagePath(id)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove image %s: %w", id, err)
	}
	return nil
}

// Get implements backend.ImageStore.
func (s *Store) Get(_ context.Context, id string) (*backend.Image, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	rec, err := s.read(id)
	if err != nil {
		return nil, err
	}
	if rec.State != stateReady {
		return nil, errdefs.NotFound("volume %s is still being created", id)
	}
	return rec.Image.Clone(), nil
}

// CheckImage reports whether the image's data is still there: ErrNotFound
// when its file is gone (the record alone cannot bring the data back).
func (s *Store) CheckImage(_ context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	st, err := os.Stat(s.ImagePath(id))
	if os.IsNotExist(err) {
		return errdefs.NotFound("the image file %s of volume %s is missing", s.ImagePath(id), id)
	}
	if err != nil {
		return fmt.Errorf("check image %s: %w", id, err)
	}
	if !st.Mode().IsRegular() {
		return errdefs.NotFound("%s is no image file", s.ImagePath(id))
	}
	return nil
}

// ErrUnchanged, returned by an Update function, ends the update without
// writing: the image is returned as it is.
var ErrUnchanged = backend.ErrUnchanged

var _ backend.Ledger = (*Store)(nil)

// UpdateGrants implements backend.Ledger with Update and UpdateInPool.
func (s *Store) UpdateGrants(ctx context.Context, id string, withPool bool, fn func(img *backend.Image, others []*backend.Image) error) (*backend.Image, error) {
	return s.update(ctx, id, withPool, fn)
}

// Update applies fn to the image's metadata under the pool lock and stores
// the result. fn's error aborts the update and is returned as it is, except
// ErrUnchanged, which skips the write.
func (s *Store) Update(ctx context.Context, id string, fn func(*backend.Image) error) (*backend.Image, error) {
	return s.update(ctx, id, false, func(img *backend.Image, _ []*backend.Image) error { return fn(img) })
}

// UpdateInPool is Update for a change that depends on the pool's other
// images (an attach limit counts a node's attachments across all of them):
// fn also gets every other ready image, read under the same lock as the
// update, so no concurrent change can invalidate what fn counted. The others
// are copies; changing them changes nothing. It reads one record per image,
// so use Update when fn does not need them.
func (s *Store) UpdateInPool(ctx context.Context, id string, fn func(img *backend.Image, others []*backend.Image) error) (*backend.Image, error) {
	return s.update(ctx, id, true, fn)
}

func (s *Store) update(ctx context.Context, id string, withOthers bool, fn func(*backend.Image, []*backend.Image) error) (*backend.Image, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	var out *backend.Image
	err := s.withLock(ctx, func() error {
		rec, err := s.read(id)
		if err != nil {
			return err
		}
		if rec.State != stateReady {
			return errdefs.NotFound("volume %s is still being created", id)
		}
		var others []*backend.Image
		if withOthers {
			all, err := s.readAll()
			if err != nil {
				return err
			}
			for _, r := range all {
				if r.ID != id {
					others = append(others, r.Image.Clone())
				}
			}
		}
		img := rec.Image.Clone()
		if err := fn(img, others); errors.Is(err, ErrUnchanged) {
			out = rec.Image.Clone()
			return nil
		} else if err != nil {
			return err
		}
		img.ID, img.Name = rec.ID, rec.Name // fn may not rename
		if err := s.write(&record{State: stateReady, Image: *img}); err != nil {
			return spaceError(err, "write metadata of %s", id)
		}
		out = img.Clone()
		return nil
	})
	return out, err
}

// Probe implements backend.ImageStore: the pool directory is there and writable.
func (s *Store) Probe(context.Context) error {
	if err := unix.Access(s.dir, unix.W_OK|unix.X_OK); err != nil {
		return errdefs.Wrap(errdefs.ErrUnavailable, err, "pool directory %s is not usable", s.dir)
	}
	return nil
}

func (s *Store) read(id string) (*record, error) {
	data, err := os.ReadFile(s.metaPath(id))
	if os.IsNotExist(err) {
		return nil, errdefs.NotFound("volume %s does not exist in %s", id, s.name)
	}
	if err != nil {
		return nil, err
	}
	var rec record
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("metadata %s is corrupt: %w", s.metaPath(id), err)
	}
	if rec.Version != recordVersion {
		return nil, fmt.Errorf("metadata %s has version %d; this Spindle reads version %d", s.metaPath(id), rec.Version, recordVersion)
	}
	return &rec, nil
}

func (s *Store) write(rec *record) error {
	rec.Version = recordVersion
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(s.metaPath(rec.ID), append(data, '\n'), 0o600)
}

// readAll returns every ready image record.
func (s *Store) readAll() ([]*record, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var out []*record
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, metaSuffix) || strings.HasPrefix(name, ".") {
			continue
		}
		rec, err := s.read(strings.TrimSuffix(name, metaSuffix))
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		if rec.State == stateReady {
			out = append(out, rec)
		}
	}
	return out, nil
}

// withLock runs fn holding the pool's flock. It waits for the lock until the
// context's deadline (or defaultLockWait), then gives up with ErrBusy.
func (s *Store) withLock(ctx context.Context, fn func() error) error {
	f, err := os.OpenFile(filepath.Join(s.dir, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return errdefs.Wrap(errdefs.ErrUnavailable, err, "open the lock of pool %s", s.name)
	}
	defer f.Close()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(defaultLockWait)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("lock pool %s: %w", s.name, err)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errdefs.Busy("pool %s is locked by another operation; try again", s.name)
		}
		time.Sleep(lockPoll)
	}
	defer func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN) }()
	return fn()
}

// RegisterNode records a node plugin that can reach this pool. It rewrites
// the record only when something changed, so restarts stay cheap.
func (s *Store) RegisterNode(_ context.Context, info backend.NodeInfo) error {
	if err := validNodeFile(info.NodeID); err != nil {
		return err
	}
	path := filepath.Join(s.dir, nodesDir, info.NodeID+".json")
	if old, err := s.readNode(path); err == nil && old.MaxVolumesPerNode == info.MaxVolumesPerNode {
		return nil
	}
	if info.RegisteredAt.IsZero() {
		info.RegisteredAt = time.Now().UTC().Truncate(time.Second)
	}
	data, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	return atomicfile.Write(path, append(data, '\n'), 0o600)
}

// Node returns a registered node, or ErrNotFound.
func (s *Store) Node(_ context.Context, nodeID string) (*backend.NodeInfo, error) {
	if err := validNodeFile(nodeID); err != nil {
		return nil, err
	}
	info, err := s.readNode(filepath.Join(s.dir, nodesDir, nodeID+".json"))
	if os.IsNotExist(err) {
		return nil, errdefs.NotFound("node %q has not registered with %s (is the Spindle node plugin running there, with the pool %s mounted?)", nodeID, s.name, s.dir)
	}
	return info, err
}

// RecordFormatted notes in the image's metadata that it now holds fsType,
// for the attachers of the backends that keep their images here.
func (s *Store) RecordFormatted(ctx context.Context, imageID, fsType string) error {
	_, err := s.Update(ctx, imageID, func(img *backend.Image) error {
		if img.Formatted && img.FsType == fsType {
			return ErrUnchanged
		}
		img.Formatted, img.FsType = true, fsType
		return nil
	})
	return err
}

func (s *Store) readNode(path string) (*backend.NodeInfo, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var info backend.NodeInfo
	if err := json.Unmarshal(data, &info); err != nil {
		return nil, fmt.Errorf("node record %s is corrupt: %w", path, err)
	}
	return &info, nil
}

func validNodeFile(nodeID string) error {
	if nodeID == "" || strings.ContainsAny(nodeID, "/\x00") || strings.HasPrefix(nodeID, ".") || len(nodeID) > 200 {
		return errdefs.InvalidArgument("node ID %q cannot be registered", nodeID)
	}
	return nil
}
