package rbd

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// A CSI snapshot is an image of its own, "csi-snap-<hash of the CSI
// name>": a copy-on-write clone of an RBD snapshot of the source,
// "csi-copy-<hash>" (cow.go), so it is of one instant, costs nothing when
// taken whatever the size of the volume, and is ready at once. Restores
// are clones of that snapshot of the source while the source lives, and
// of the image's own RBD snapshot "csi-snap" (made when first needed)
// afterwards. The source volume can be deleted while the snapshot lives:
// it goes to the pool's trash until its last clone is gone (trash.go).
// Snapshots made by earlier versions carry "csi-snap" from the start (a
// clone with csi-snap, or a full copy with csi-snap protected); they are
// read, restored and deleted the same way.

// CreateSnapshot implements backend.Snapshotter.
func (s *Store) CreateSnapshot(ctx context.Context, spec backend.SnapshotSpec) (*backend.Snapshot, error) {
	if spec.Name == "" {
		return nil, errdefs.InvalidArgument("snapshot name is empty")
	}
	source, err := s.volumeRef(spec.SourceImageID)
	if err != nil {
		return nil, err
	}
	opts, err := s.snapshotOptionsOf(source, spec.Parameters)
	if err != nil {
		return nil, err
	}
	// A snapshot lives beside its source.
	r := source.location.ref(hashedName(opts.prefix, spec.Name))
	id := s.idOf(r)
	defer s.locks.lock(id)()

	existing, err := s.GetSnapshot(ctx, id)
	switch {
	case err == nil:
		if existing.SourceImageID != spec.SourceImageID {
			return nil, errdefs.AlreadyExists("snapshot %q already exists of volume %s, not of %s", spec.Name, existing.SourceImageID, spec.SourceImageID)
		}
		return existing, nil
	case errdefs.KindOf(err) == errdefs.ErrNotFound:
	default:
		return nil, err
	}
	src, srcInfo, err := s.describeVolume(ctx, spec.SourceImageID)
	if err != nil {
		return nil, err
	}
	if err := s.checkRoom(ctx, src.CapacityBytes); err != nil {
		return nil, err
	}
	depth, err := s.admitClone(ctx, source, "", fmt.Sprintf("snapshot %q of volume %s", spec.Name, src.ID))
	if err != nil {
		return nil, err
	}
	rec := snapshotRecord{
		SourceImageID: src.ID, SizeBytes: src.CapacityBytes, CreatedAt: time.Now().UTC().Truncate(time.Second),
		AccessType: src.AccessType, FsType: src.FsType, Formatted: src.Formatted, Encryption: spec.Encryption,
	}
	features := snapshotImageFeatures(userFeatures(srcInfo.Features))
	build := func(tmp ref) error {
		// The source's snapshot stays for as long as the CSI snapshot
		// (cow.go): restores are cloned from it while the source lives.
		return s.cloneOfNow(ctx, source, srcInfo, copySnapPrefix+hashOf(r.image), tmp, ceph.ImageOptions{Features: features}, src.CapacityBytes, true)
	}
	meta := map[string]string{metaName: spec.Name, metaSnapshot: mustJSON(rec), metaDepth: depthValue(depth)}
	if err := s.buildAndRename(ctx, r, build, meta); err != nil {
		// The source's snapshot is no CSI snapshot's now: it goes too.
		undo := context.WithoutCancel(ctx)
		if cl, cerr := s.client(undo, source.location); cerr == nil {
			_ = cl.RemoveSnapshot(undo, source.cephImage(), copySnapPrefix+hashOf(r.image))
		}
		return nil, err
	}
	s.settleDepth(ctx, r, depth)
	return decodeSnapshot(id, r, meta)
}

// userFeatures keeps the features of "rbd info" that an image can be
// created with (not Ceph's internal ones, such as "operations").
func userFeatures(features []string) []string {
	var out []string
	for _, f := range features {
		if _, ok := featureNeeds[f]; ok {
			out = append(out, f)
		}
	}
	if !slices.Contains(out, "layering") {
		out = append(out, "layering")
	}
	return out
}

// GetSnapshot implements backend.Snapshotter.
func (s *Store) GetSnapshot(ctx context.Context, id string) (*backend.Snapshot, error) {
	r, err := s.snapshotRef(id)
	if err != nil {
		return nil, err
	}
	// The record is all there is to read: the metadata alone (one round
	// trip, where opening the image takes several).
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return nil, err
	}
	meta, err := cl.ImageMetadata(ctx, r.cephImage())
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return nil, errdefs.NotFound("snapshot %s does not exist", id)
	}
	if err != nil {
		return nil, err
	}
	if meta[metaSnapshot] == "" {
		return nil, errdefs.NotFound("snapshot %s does not exist (image %s carries no %s metadata)", id, r.spec(), metaSnapshot)
	}
	return decodeSnapshot(id, r, meta)
}

// decodeSnapshot builds the backend's view of a snapshot image.
func decodeSnapshot(id string, r ref, meta map[string]string) (*backend.Snapshot, error) {
	var rec snapshotRecord
	if err := json.Unmarshal([]byte(meta[metaSnapshot]), &rec); err != nil {
		return nil, fmt.Errorf("image %s: metadata %s: %w", r.spec(), metaSnapshot, err)
	}
	return &backend.Snapshot{
		ID: id, Name: meta[metaName], SourceImageID: rec.SourceImageID, SizeBytes: rec.SizeBytes,
		CreatedAt: rec.CreatedAt, ReadyToUse: true, AccessType: rec.AccessType, FsType: rec.FsType, Formatted: rec.Formatted,
		Encryption: rec.Encryption,
	}, nil
}

// ListSnapshots implements backend.Snapshotter: the snapshots of every
// location the instance has images in. An image is a snapshot when it
// carries a snapshot record (Spindle's own names, and those a
// snapshotNamePrefix gave).
func (s *Store) ListSnapshots(ctx context.Context) ([]*backend.Snapshot, error) {
	locs, err := s.locations(ctx)
	if err != nil {
		return nil, err
	}
	var out []*backend.Snapshot
	for _, l := range locs {
		names, err := s.listImages(ctx, l)
		if err != nil {
			return nil, err
		}
		for _, name := range names {
			if strings.HasPrefix(name, volumePrefix) || strings.HasPrefix(name, tmpPrefix) || !imageNameRe.MatchString(name) {
				continue
			}
			snap, err := s.GetSnapshot(ctx, s.idOf(l.ref(name)))
			if errdefs.KindOf(err) == errdefs.ErrNotFound {
				continue
			}
			if err != nil {
				return nil, err
			}
			out = append(out, snap)
		}
	}
	slices.SortFunc(out, func(a, b *backend.Snapshot) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// DeleteSnapshot implements backend.Snapshotter. Volumes restored from the
// snapshot keep their data: the snapshot image waits in the trash until
// they are gone (trash.go).
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	r, err := s.snapshotRef(id)
	if err != nil {
		return nil
	}
	defer s.locks.lock(id)()
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return err
	}
	head, err := cl.ImageHeader(ctx, r.cephImage())
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return nil
	}
	if err != nil {
		return err
	}
	if head.Metadata[metaSnapshot] == "" {
		return nil // no snapshot of Spindle's: nothing of ours to delete
	}
	if head.Snapshots == 0 && !slices.Contains(head.Features, "exclusive-lock") {
		return s.removeSnapshotImage(ctx, r, head)
	}
	// Snapshots of its own (restores hang from them), or a lock that may
	// be held: the whole way.
	in, err := s.inspect(ctx, r)
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return nil
	}
	if err != nil {
		return err
	}
	if err := s.remove(ctx, r, in); err != nil {
		return err
	}
	// The source volume's snapshot the image hangs from goes too (into the
	// source's trash namespace while restores hang from it), after the
	// answer; one the volume no longer has under that name (the volume
	// deleted, or a snapshot of an earlier version) went already.
	if p := in.Info.Parent; p != nil && !p.Trash && strings.HasPrefix(p.Snapshot, copySnapPrefix) {
		src := location{cluster: r.cluster, pool: p.Pool, namespace: p.Namespace}.ref(p.Image)
		s.afterAnswer(ctx, src.spec(), func(ctx context.Context) { _ = s.dropCopySnapshot(ctx, r, src, p.Snapshot) })
	}
	return nil
}

// removeSnapshotImage deletes a snapshot image that has no snapshot of
// its own and cannot be locked, without opening it (the open of a clone
// opens its parents): nothing hangs from it, no node ever maps a snapshot
// image, so it goes to the trash and its removal is queued. The source's
// snapshot it was cloned from, csi-copy-<hash> (cow.go), goes after the
// answer.
func (s *Store) removeSnapshotImage(ctx context.Context, r ref, head *ceph.ImageHeader) error {
	var rec snapshotRecord
	if err := json.Unmarshal([]byte(head.Metadata[metaSnapshot]), &rec); err != nil {
		return fmt.Errorf("image %s: metadata %s: %w", r.spec(), metaSnapshot, err)
	}
	if !isSpindleImage(r.image) {
		if err := s.registerTrashed(ctx, r.location, head.ID, r.image); err != nil {
			return err
		}
	}
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return err
	}
	if err := cl.TrashMove(ctx, r.cephImage()); err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
		return err
	}
	// Its removal is queued after the answer, as remove does.
	s.afterAnswer(ctx, "", func(ctx context.Context) { _ = s.removeInBackground(ctx, r.location, head.ID, r.image) })
	if src, err := s.volumeRef(rec.SourceImageID); err == nil {
		s.afterAnswer(ctx, src.spec(), func(ctx context.Context) { _ = s.dropCopySnapshot(ctx, r, src, copySnapPrefix+hashOf(r.image)) })
	}
	return nil
}

// dropCopySnapshot removes src@snap, the RBD snapshot the deleted CSI
// snapshot image r was cloned from, unless a CSI snapshot of the same name
// was taken again meanwhile (it hangs from the same snapshot).
func (s *Store) dropCopySnapshot(ctx context.Context, r, src ref, snap string) error {
	defer s.locks.lock(s.idOf(r))()
	cl, err := s.client(ctx, src.location)
	if err != nil {
		return err
	}
	if _, err := cl.StatImage(ctx, r.cephImage(), ""); errdefs.KindOf(err) != errdefs.ErrNotFound {
		return err // taken again, or the cluster did not say
	}
	if err := cl.RemoveSnapshot(ctx, src.cephImage(), snap); err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
		return fmt.Errorf("remove snapshot %s, which snapshot %s was taken from: %w", src.at(snap), s.idOf(r), err)
	}
	return nil
}
