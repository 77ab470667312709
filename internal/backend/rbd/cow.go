package rbd

import (
	"context"
	"slices"
	"strconv"
	"strings"

	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Copy-on-write. A CSI snapshot, a restore and a volume clone are all RBD
// clones, made in the same few metadata operations whatever the size of
// the data:
//
//   - a snapshot of volume V is the image csi-snap-<hash>, a clone of an
//     RBD snapshot V@csi-copy-<hash>, which stays on V as long as the CSI
//     snapshot lives;
//   - a restore is a clone of V@csi-copy-<hash> while V lives, else of
//     csi-snap-<hash>@csi-snap, an RBD snapshot of the snapshot image made
//     at the first restore that needs it;
//   - a clone of volume V is a clone of a short-lived V@csi-clone-<hash>.
//
// Every RBD snapshot costs an update of the cluster's OSD map, which the
// monitors commit at most once a second (paxos_propose_interval): a
// snapshot taken, another removed and a third taken, as ceph-csi does,
// make a CreateSnapshot wait for three commits. This way it waits for
// one, and a restore, while its source lives, for none.
//
// Clones are of format 2 (Ceph Mimic and later), asked for explicitly so
// that the cluster's rbd_default_clone_format ("auto": format 1 unless the
// cluster requires Mimic clients) does not matter: no "snap protect", and a
// snapshot removed while it has clones moves to the image's trash
// namespace, where Ceph removes it itself when its last clone goes. So a
// volume's csi-copy- snapshot goes with its CSI snapshot (or with the
// volume, into the trash namespace, while clones hang from it), and a
// clone's short-lived csi-clone- snapshot as soon as the clone exists. A
// volume or snapshot deleted while clones still hang from it goes to the
// pool's trash (trash.go) and is removed once they are gone.
//
// Each clone records in its metadata how many copy-on-write parents it had
// when made (spindle.depth). Past MaxCloneDepth it is flattened in the
// background (tasks.go); a clone that would be deeper than
// HardMaxCloneDepth is refused until the flatten that shortens its
// parent's chain is done.

// snapshotImageFeatures are the features of a snapshot image: its
// source's, plus deep-flatten, so that flattening a snapshot image also
// frees its csi-snap snapshot, which restores hang from, from its parent.
// Nodes never map a snapshot image, so no kernel client needs to know the
// feature.
func snapshotImageFeatures(features []string) []string {
	f := slices.Clone(features)
	if !slices.Contains(f, "deep-flatten") {
		f = append(f, "deep-flatten")
	}
	return f
}

// clone makes tmp a copy-on-write clone (format 2, whatever the cluster's
// rbd_default_clone_format says) of parent@snap with the given image
// options (features, data pool, striping), grown to size. The parent may
// be in another pool or namespace of tmp's cluster.
func (s *Store) clone(ctx context.Context, parent ref, snap string, tmp ref, opts ceph.ImageOptions, size, srcSize int64) error {
	cl, err := s.client(ctx, tmp.location)
	if err != nil {
		return err
	}
	if err := cl.CloneImage(ctx, parent.cephImage(), snap, tmp.cephImage(), opts); err != nil {
		return err
	}
	if size > srcSize {
		return cl.ResizeImage(ctx, tmp.cephImage(), uint64(size))
	}
	return nil
}

// cloneOfNow makes tmp a copy-on-write clone of the image src as it is at
// this instant: an RBD snapshot src@snap and the clone; unless keep, the
// snapshot is removed again (with a clone it moves to src's trash
// namespace). On failure neither the clone nor the snapshot is left.
func (s *Store) cloneOfNow(ctx context.Context, src ref, srcInfo *ceph.ImageInfo, snap string, tmp ref, opts ceph.ImageOptions, size int64, keep bool) error {
	cl, err := s.client(ctx, src.location)
	if err != nil {
		return err
	}
	if err := cl.CreateSnapshot(ctx, src.cephImage(), snap); err != nil && errdefs.KindOf(err) != errdefs.ErrAlreadyExists {
		return err
	}
	err = s.clone(ctx, src, snap, tmp, opts, size, int64(srcInfo.Size))
	if err == nil && keep {
		return nil
	}
	if err == nil {
		if err = cl.RemoveSnapshot(ctx, src.cephImage(), snap); errdefs.KindOf(err) == errdefs.ErrNotFound {
			err = nil
		}
		if err == nil {
			return nil
		}
	}
	undo := context.WithoutCancel(ctx)
	s.removeTemporary(undo, tmp)
	_ = cl.RemoveSnapshot(undo, src.cephImage(), snap)
	return err
}

// restoreSource is the image and snapshot a restore of the snapshot image
// r is cloned from, and the depth the restore will have: r@csi-snap where
// r has it (those made by earlier versions, and where a restore made it);
// else the source volume's csi-copy- snapshot r hangs from, while the
// volume lives and that chain is short enough; else r@csi-snap, made now.
func (s *Store) restoreSource(ctx context.Context, r ref, what string) (ref, string, int, error) {
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return ref{}, "", 0, err
	}
	in, err := cl.InspectImage(ctx, r.cephImage())
	if err != nil {
		return ref{}, "", 0, err
	}
	if slices.ContainsFunc(in.Snapshots, func(sn ceph.SnapInfo) bool { return sn.Namespace == ceph.SnapUser && sn.Name == snapshotSnap }) {
		depth, err := s.admitClone(ctx, r, snapshotSnap, what)
		return r, snapshotSnap, depth, err
	}
	if p := in.Info.Parent; p != nil && !p.Trash && strings.HasPrefix(p.Snapshot, copySnapPrefix) {
		src := location{cluster: r.cluster, pool: p.Pool, namespace: p.Namespace}.ref(p.Image)
		// The snapshot is the volume's under its own name while the CSI
		// snapshot lives (in the trash namespace it has another).
		if chain, err := s.chainAt(ctx, src, p.Snapshot); err == nil && chain+1 <= s.cfg.HardMaxCloneDepth {
			return src, p.Snapshot, chain + 1, nil
		} else if err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
			return ref{}, "", 0, err
		}
	}
	if err := cl.CreateSnapshot(ctx, r.cephImage(), snapshotSnap); err != nil && errdefs.KindOf(err) != errdefs.ErrAlreadyExists {
		return ref{}, "", 0, err
	}
	depth, err := s.admitClone(ctx, r, snapshotSnap, what)
	return r, snapshotSnap, depth, err
}

// chainAt is how many copy-on-write parents data read from image (at
// snapshot snap, or its head when snap is "") goes through: 0 when it has
// no parent (never a clone, or flattened), else what the image recorded
// when it was made. An image made before Spindle recorded it (its parents
// are all named) is walked.
func (s *Store) chainAt(ctx context.Context, r ref, snap string) (int, error) {
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return 0, err
	}
	info, err := cl.StatImage(ctx, r.cephImage(), snap)
	if err != nil {
		return 0, err
	}
	if info.Parent == nil {
		return 0, nil
	}
	v, err := cl.ImageMetadataValue(ctx, r.cephImage(), metaDepth)
	if err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
		return 0, err
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 {
		return n, nil
	}
	return s.walkDepth(ctx, cl, info)
}

// walkDepth counts the parents above img by name, for images whose
// parents are all named (those made before Spindle recorded depths).
func (s *Store) walkDepth(ctx context.Context, cl ceph.Client, img *ceph.ImageInfo) (int, error) {
	n := 0
	for p := img.Parent; p != nil && n <= maxParentChain; n++ {
		snap := p.Snapshot
		if p.Trash {
			snap = ""
		}
		parent, err := cl.StatImage(ctx, ceph.PoolSpec{Pool: p.Pool, Namespace: p.Namespace}.Image(p.Image), snap)
		if err != nil {
			return 0, err
		}
		p = parent.Parent
	}
	return n, nil
}

// admitClone decides whether a clone of image (at snap) may be made, and
// returns the depth it will have. Past HardMaxCloneDepth it refuses with
// ErrBusy (ABORTED: the sidecars retry it with a backoff, and nothing is
// created meanwhile), once it has made sure that image is being flattened,
// which brings its chain to 0.
func (s *Store) admitClone(ctx context.Context, r ref, snap, what string) (int, error) {
	chain, err := s.chainAt(ctx, r, snap)
	if err != nil {
		return 0, err
	}
	depth := chain + 1
	if depth <= s.cfg.HardMaxCloneDepth {
		return depth, nil
	}
	if err := s.flattenInBackground(ctx, r); err != nil {
		return 0, err
	}
	return 0, errdefs.Busy("%s would be a copy-on-write clone %d parents deep, beyond hardMaxCloneDepth %d: %s is being flattened in the background (see `ceph rbd task list`); retry when it is done",
		what, depth, s.cfg.HardMaxCloneDepth, r.spec())
}

// settleDepth flattens a new image in the background when its chain is
// longer than MaxCloneDepth. The image is usable meanwhile; a task that
// cannot be queued now is queued by Maintain.
func (s *Store) settleDepth(ctx context.Context, r ref, depth int) {
	if depth > s.cfg.MaxCloneDepth {
		_ = s.flattenInBackground(ctx, r)
	}
}
