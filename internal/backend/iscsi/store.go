package iscsi

import (
	"context"
	"maps"
	"slices"
	"sync"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/filestore"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// pool is the target host's pool directory, opened (created when missing,
// swept) at its first use. Only the controller's roles use it: a node
// plugin is built from the same configuration, and neither needs the
// directory nor creates it.
type pool struct {
	opts filestore.Options
	mu   sync.Mutex
	fs   *filestore.Store
}

// open returns the pool, opening it the first time; a failed open is
// retried by the next call.
func (p *pool) open() (*filestore.Store, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fs == nil {
		fs, err := filestore.New(p.opts)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.ErrUnavailable, err, "open the pool %s of %s", p.opts.Dir, p.opts.Name)
		}
		p.fs = fs
	}
	return p.fs, nil
}

// nodeRegistry is the nodes that registered in this process: a node plugin
// in the controller's process (--mode=all) registers here, and the
// controller then knows its nodes and refuses others (ErrNotFound). A
// controller on its own has no registry to read (the nodes share no
// storage with it): it accepts any node whose ID makes an initiator name,
// as Kubernetes publishes only to nodes whose CSINode lists the driver,
// and the target's ACL admits exactly that node's initiator. A node's
// MaxVolumesPerNode is so enforced here only in --mode=all; elsewhere the
// scheduler enforces it, from NodeGetInfo.
type nodeRegistry struct {
	mu    sync.Mutex
	nodes map[string]backend.NodeInfo
}

func (r *nodeRegistry) register(info backend.NodeInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nodes == nil {
		r.nodes = map[string]backend.NodeInfo{}
	}
	r.nodes[info.NodeID] = info
}

func (r *nodeRegistry) lookup(nodeID, instance string) (*backend.NodeInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if info, ok := r.nodes[nodeID]; ok {
		return &info, nil
	}
	if len(r.nodes) > 0 {
		return nil, errdefs.NotFound("node %q has not registered with %s (this process serves node requests for %s only)", nodeID, instance, slices.Sorted(maps.Keys(r.nodes)))
	}
	return &backend.NodeInfo{NodeID: nodeID}, nil
}

// Store is the pool with the targets kept in step: Delete removes a target
// an interrupted unpublish left, Expand makes a published LUN take the new
// size, and the grants of the Ledger know the nodes of this process only
// (nodeRegistry). The pool is opened at the first call.
type Store struct {
	pool    *pool
	targets *targets
	nodes   *nodeRegistry
	probe   signatureProber
	key     string // "iscsi/<instance>", for messages
}

var (
	_ backend.ImageStore  = (*Store)(nil)
	_ backend.Snapshotter = (*Store)(nil)
	_ backend.Ledger      = (*Store)(nil)
	_ backend.Reconciler  = (*Store)(nil)
	// Key rotation of an encrypted volume rewrites the image's record.
	_ backend.EncryptionKeeper = (*Store)(nil)
)

// Pool is the opened pool directory.
func (s *Store) Pool() (*filestore.Store, error) { return s.pool.open() }

// Create implements backend.ImageStore.
func (s *Store) Create(ctx context.Context, spec backend.VolumeSpec) (*backend.Image, error) {
	fs, err := s.pool.open()
	if err != nil {
		return nil, err
	}
	return fs.Create(ctx, spec)
}

// Delete implements backend.ImageStore.
func (s *Store) Delete(ctx context.Context, id string) error {
	fs, err := s.pool.open()
	if err != nil {
		return err
	}
	if err := fs.Delete(ctx, id); err != nil {
		return err
	}
	// An unreachable tgtd holds no target to remove (it forgets them all
	// when it restarts); the controller's start-up reconcile removes strays.
	if err := s.targets.tool.Remove(ctx, s.targets.targetIQN(id)); err != nil && errdefs.KindOf(err) != errdefs.ErrUnavailable {
		return err
	}
	return s.targets.removeRecord(fs, id)
}

// SetEncryption implements backend.EncryptionKeeper: the pool keeps an
// image's key as the loop backend's does.
func (s *Store) SetEncryption(ctx context.Context, id string, e *backend.Encryption) error {
	fs, err := s.pool.open()
	if err != nil {
		return err
	}
	return fs.SetEncryption(ctx, id, e)
}

// Get implements backend.ImageStore and backend.Ledger.
func (s *Store) Get(ctx context.Context, id string) (*backend.Image, error) {
	fs, err := s.pool.open()
	if err != nil {
		return nil, err
	}
	return fs.Get(ctx, id)
}

// List implements backend.ImageStore.
func (s *Store) List(ctx context.Context) ([]*backend.Image, error) {
	fs, err := s.pool.open()
	if err != nil {
		return nil, err
	}
	return fs.List(ctx)
}

// Expand implements backend.ImageStore. The LUN is resized on every call
// for a published volume, so a retry after a failed resize completes it.
func (s *Store) Expand(ctx context.Context, id string, newBytes int64) (*backend.Image, error) {
	fs, err := s.pool.open()
	if err != nil {
		return nil, err
	}
	img, err := fs.Expand(ctx, id, newBytes)
	if err != nil || len(img.Attachments) == 0 {
		return img, err
	}
	x, err := s.targets.export(fs, img, nil)
	if err != nil {
		return nil, err
	}
	if err := s.targets.tool.Resize(ctx, x); err != nil {
		return nil, err
	}
	return img, nil
}

// Modify implements backend.ImageStore.
func (s *Store) Modify(ctx context.Context, id string, mutable map[string]string) (*backend.Image, error) {
	fs, err := s.pool.open()
	if err != nil {
		return nil, err
	}
	return fs.Modify(ctx, id, mutable)
}

// Capacity implements backend.ImageStore.
func (s *Store) Capacity(ctx context.Context) (backend.Capacity, error) {
	fs, err := s.pool.open()
	if err != nil {
		return backend.Capacity{}, err
	}
	return fs.Capacity(ctx)
}

// Probe implements backend.ImageStore: the pool and the target are usable.
func (s *Store) Probe(ctx context.Context) error {
	fs, err := s.pool.open()
	if err != nil {
		return err
	}
	if err := fs.Probe(ctx); err != nil {
		return err
	}
	return s.targets.tool.Probe(ctx)
}

// CheckImage implements backend.ImageChecker (the controller's volume
// health): the image file is still in the pool.
func (s *Store) CheckImage(ctx context.Context, id string) error {
	fs, err := s.pool.open()
	if err != nil {
		return err
	}
	return fs.CheckImage(ctx, id)
}

// CreateSnapshot implements backend.Snapshotter.
func (s *Store) CreateSnapshot(ctx context.Context, spec backend.SnapshotSpec) (*backend.Snapshot, error) {
	fs, err := s.pool.open()
	if err != nil {
		return nil, err
	}
	return fs.CreateSnapshot(ctx, spec)
}

// DeleteSnapshot implements backend.Snapshotter.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	fs, err := s.pool.open()
	if err != nil {
		return err
	}
	return fs.DeleteSnapshot(ctx, id)
}

// GetSnapshot implements backend.Snapshotter.
func (s *Store) GetSnapshot(ctx context.Context, id string) (*backend.Snapshot, error) {
	fs, err := s.pool.open()
	if err != nil {
		return nil, err
	}
	return fs.GetSnapshot(ctx, id)
}

// ListSnapshots implements backend.Snapshotter.
func (s *Store) ListSnapshots(ctx context.Context) ([]*backend.Snapshot, error) {
	fs, err := s.pool.open()
	if err != nil {
		return nil, err
	}
	return fs.ListSnapshots(ctx)
}

// Node implements backend.Ledger from the nodes registered in this
// process (nodeRegistry).
func (s *Store) Node(_ context.Context, nodeID string) (*backend.NodeInfo, error) {
	return s.nodes.lookup(nodeID, s.key)
}

// UpdateGrants implements backend.Ledger.
func (s *Store) UpdateGrants(ctx context.Context, id string, withPool bool, fn func(img *backend.Image, others []*backend.Image) error) (*backend.Image, error) {
	fs, err := s.pool.open()
	if err != nil {
		return nil, err
	}
	return fs.UpdateGrants(ctx, id, withPool, fn)
}

// Reconcile makes the target host match the pool, as after a tgtd restart:
// every published volume gets its target back (those published with CHAP
// locked, with an empty ACL, until their next publish brings the
// credentials); targets of this instance that belong to no published volume
// go. A controller runs it when it starts (backend.Reconciler); it returns
// the targets it rebuilt or removed.
func (s *Store) Reconcile(ctx context.Context) ([]string, error) {
	fs, err := s.pool.open()
	if err != nil {
		return nil, err
	}
	return s.targets.reconcile(ctx, fs)
}
