package rbd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Deleting. A deleted volume or snapshot image leaves its name at once: it
// is moved to the pool's trash ("rbd trash mv", a metadata operation), so
// the RPC answers quickly whatever the image holds, and its data is
// removed in the background ("ceph rbd task add trash remove", tasks.go).
// An image that copy-on-write clones still hang from (a volume with live
// snapshots, a snapshot with restores) keeps its data in the trash until
// the last of them is gone: Ceph removes the snapshot they hang from with
// the last clone, and purgeTrash then queues the image's removal. So
// volumes and snapshots can be deleted in any order, and nothing is left
// once all are.

// remove deletes an unpublished volume or snapshot image, inspected
// already: no watchers, locks broken, its own snapshots removed, then to
// the trash, and its data removed in the background once nothing hangs
// from it. When nothing holds the image, that is three calls to the
// cluster after the inspection.
func (s *Store) remove(ctx context.Context, r ref, in *ceph.Inspection) error {
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return err
	}
	w, err := s.withoutManager(ctx, cl, in.Watchers)
	if err != nil {
		return err
	}
	if len(w) > 0 {
		return errdefs.Precondition("image %s still has watchers %s: a node still has it mapped (or a client died less than 30 s ago)", r.spec(), strings.Join(w, ", "))
	}
	// Removing a locked image waits for the lock forever.
	for _, l := range in.Locks {
		if err := cl.BreakLock(ctx, r.cephImage(), l); err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
			return err
		}
	}
	if err := s.dropOwnedSnapshots(ctx, r, in.Snapshots); err != nil {
		return err
	}
	if !isSpindleImage(r.image) {
		// A name of a volumeNamePrefix or snapshotNamePrefix, or an
		// adopted image's: purgeTrash knows it is Spindle's only by this.
		if err := s.registerTrashed(ctx, r.location, in.Info.ID, r.image); err != nil {
			return err
		}
	}
	if err := cl.TrashMove(ctx, r.cephImage()); err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
		return err
	}
	// The removal of its data is queued after the answer: the image is
	// out of its name already, and what this process fails to queue the
	// next upkeep does (purgeTrash).
	l, id := r.location, in.Info.ID
	if len(in.Snapshots) == 0 {
		// Nothing hangs from it: no need to look again.
		s.afterAnswer(ctx, "", func(ctx context.Context) { _ = s.removeInBackground(ctx, l, id, r.image) })
	} else {
		s.afterAnswer(ctx, "", func(ctx context.Context) { _ = s.removeIfFree(ctx, l, id, r.image) })
	}
	// A clone made by an earlier version hung from a protected csi-clone-
	// snapshot of its own on the source; it goes with the clone's data
	// (dropLegacyCloneSnapshots).
	if r.cluster != s.cfg.ClusterID {
		// The background upkeep (Maintain) holds no credentials for a
		// cluster of the map: a request that does tidies its location
		// (images that waited in the trash for clones now gone). Best
		// effort: the delete itself is done, and the next one retries.
		_, _ = s.purgeTrash(ctx, r.location)
	}
	return nil
}

// removeIfFree queues the removal of the trashed image id once no clone
// hangs from it any more (it has no snapshot left, in any namespace).
func (s *Store) removeIfFree(ctx context.Context, l location, id, name string) error {
	cl, err := s.client(ctx, l)
	if err != nil {
		return err
	}
	snaps, err := cl.SnapshotsOfID(ctx, l.cephPool(), id)
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return nil // removed already
	}
	if err != nil {
		return err
	}
	if len(snaps) > 0 {
		return nil // clones hang from it: purgeTrash comes back for it
	}
	return s.removeInBackground(ctx, l, id, name)
}

// userSnapshots lists an image's snapshots of the user namespace (those
// "rbd snap ls" shows, which Spindle takes).
func (s *Store) userSnapshots(ctx context.Context, r ref) ([]ceph.SnapInfo, error) {
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return nil, err
	}
	all, err := cl.Snapshots(ctx, r.cephImage())
	if err != nil {
		return nil, err
	}
	return userOnly(all), nil
}

// userOnly are the snapshots of the user namespace among all.
func userOnly(all []ceph.SnapInfo) []ceph.SnapInfo {
	return slices.DeleteFunc(slices.Clone(all), func(sn ceph.SnapInfo) bool { return sn.Namespace != ceph.SnapUser })
}

// dropOwnedSnapshots removes the image's snapshots, all of which must be
// Spindle's (a snapshot somebody else took is a precondition failure: it
// is not ours to delete). A snapshot with format-2 clones moves to the
// image's trash namespace and stays until they are gone. A protected
// snapshot made by an earlier version cannot go while clones hang from it:
// they are flattened in the background and the delete is refused with
// ErrBusy until they are.
func (s *Store) dropOwnedSnapshots(ctx context.Context, r ref, all []ceph.SnapInfo) error {
	snaps := userOnly(all)
	for _, sn := range snaps {
		if !strings.HasPrefix(sn.Name, cloneSnapPrefix) && !strings.HasPrefix(sn.Name, copySnapPrefix) && sn.Name != snapshotSnap {
			return errdefs.Precondition("image %s has snapshot %s that Spindle did not take; remove it first", r.spec(), sn.Name)
		}
	}
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return err
	}
	var flattening []string
	for _, sn := range snaps {
		if sn.Protected {
			busy, err := s.unprotect(ctx, r, sn.Name)
			if err != nil {
				return err
			}
			if len(busy) > 0 {
				flattening = append(flattening, busy...)
				continue
			}
		}
		if err := cl.RemoveSnapshot(ctx, r.cephImage(), sn.Name); err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
			return err
		}
	}
	if len(flattening) > 0 {
		return errdefs.Busy("image %s has clones made by an earlier version of Spindle hanging from its protected snapshots: %s are being flattened in the background (see `ceph rbd task list`); retry when that is done",
			r.spec(), strings.Join(flattening, ", "))
	}
	return nil
}

// unprotect unprotects r@snap. While clones of format 1 hang from it
// (Ceph refuses with EBUSY), it has them flattened in the background and
// returns them.
func (s *Store) unprotect(ctx context.Context, r ref, snap string) ([]string, error) {
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return nil, err
	}
	err = cl.UnprotectSnapshot(ctx, r.cephImage(), snap)
	if err == nil || ceph.Errno(err) != ceph.EBUSY {
		return nil, err
	}
	children, cerr := cl.Children(ctx, r.cephImage(), snap)
	if cerr != nil {
		return nil, cerr
	}
	var busy []string
	for _, ch := range children {
		child := location{cluster: r.cluster, pool: ch.Pool, namespace: ch.Namespace}.ref(ch.Image)
		if ch.Trash {
			// A deleted clone: it goes with its trash entry.
			busy = append(busy, child.spec()+" (deleted, being removed)")
			continue
		}
		if err := s.flattenInBackground(ctx, child); err != nil {
			return nil, fmt.Errorf("flatten %s, a clone of %s: %w", child.spec(), r.at(snap), err)
		}
		busy = append(busy, child.spec())
	}
	if len(busy) == 0 {
		return nil, err // EBUSY for another reason
	}
	return busy, nil
}

// removeNow removes an image that holds no data worth a background task
// (a temporary image of a failed create: a fresh clone or an empty image)
// with its snapshots, at once.
func (s *Store) removeNow(ctx context.Context, r ref) error {
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return err
	}
	snaps, err := s.userSnapshots(ctx, r)
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return nil
	}
	if err != nil {
		return err
	}
	for _, sn := range snaps {
		if sn.Protected {
			if err := cl.UnprotectSnapshot(ctx, r.cephImage(), sn.Name); err != nil {
				return err
			}
		}
		if err := cl.RemoveSnapshot(ctx, r.cephImage(), sn.Name); err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
			return err
		}
	}
	if err := cl.RemoveImage(ctx, r.cephImage()); err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
		return err
	}
	return nil
}

// trashedObject is the RADOS object, in each location, whose omap keys are
// the IDs of the images Spindle moved to the trash under a name that is
// not one of its own prefixes (a volumeNamePrefix, a snapshotNamePrefix,
// an adopted image): a trash entry keeps only the name and the ID, and
// another user's trashed image must never be purged.
const trashedObject = "spindle.trashed"

// registerTrashed records that the image id (named name) is Spindle's,
// before it moves to the trash.
func (s *Store) registerTrashed(ctx context.Context, l location, id, name string) error {
	cl, err := s.client(ctx, l)
	if err == nil {
		err = cl.SetOmap(ctx, l.cephPool(), trashedObject, map[string][]byte{id: []byte(name)})
	}
	if err != nil {
		return fmt.Errorf("record %s (%s) as Spindle's before it goes to the trash: %w", l.ref(name).spec(), id, err)
	}
	return nil
}

// registeredTrashed lists the IDs registerTrashed recorded in l.
func (s *Store) registeredTrashed(ctx context.Context, cl ceph.Client, l location) (map[string]bool, error) {
	keys, err := cl.OmapKeys(ctx, l.cephPool(), trashedObject)
	if err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	for _, id := range keys {
		ids[id] = true
	}
	return ids, nil
}

// purgeTrash queues the removal of every trashed Spindle image of a
// location that no clone hangs from any more, and drops the protected
// csi-clone- snapshots that clones made by earlier versions left once
// those clones are gone. It returns what it queued or removed.
func (s *Store) purgeTrash(ctx context.Context, l location) ([]string, error) {
	cl, err := s.client(ctx, l)
	if err != nil {
		return nil, err
	}
	entries, err := cl.Trash(ctx, l.cephPool())
	if err != nil {
		return nil, err
	}
	registered, err := s.registeredTrashed(ctx, cl, l)
	if err != nil {
		return nil, err
	}
	var changed []string
	var errs []error
	inTrash := map[string]bool{}
	for _, e := range entries {
		inTrash[e.ID] = true
		if !isSpindleImage(e.Name) && !registered[e.ID] {
			continue
		}
		snaps, err := cl.SnapshotsOfID(ctx, l.cephPool(), e.ID)
		if err != nil {
			if errdefs.KindOf(err) != errdefs.ErrNotFound {
				errs = append(errs, err)
			}
			continue
		}
		if len(snaps) > 0 {
			continue
		}
		if err := s.removeInBackground(ctx, l, e.ID, e.Name); errdefs.KindOf(err) == errdefs.ErrNotFound {
			continue // removed meanwhile (a delete's own removal)
		} else if err != nil {
			errs = append(errs, fmt.Errorf("remove trashed image %s (%s): %w", l.ref(e.Name).spec(), e.ID, err))
			continue
		}
		changed = append(changed, "removing trashed image "+l.ref(e.Name).spec()+" ("+e.ID+")")
	}
	// The records of images that left the trash (removed) go too.
	var gone []string
	for id := range registered {
		if !inTrash[id] {
			gone = append(gone, id)
		}
	}
	if len(gone) > 0 {
		slices.Sort(gone)
		if err := cl.RemoveOmapKeys(ctx, l.cephPool(), trashedObject, gone); err != nil {
			errs = append(errs, fmt.Errorf("forget removed images %s in %s: %w", strings.Join(gone, ", "), l, err))
		}
	}
	dropped, err := s.dropLegacyCloneSnapshots(ctx, l)
	return append(changed, dropped...), errors.Join(append(errs, err)...)
}

// dropLegacyCloneSnapshots removes the csi-clone- snapshots that no clone
// hangs from: those earlier versions kept, protected, for each volume
// clone, once the clone is gone, and those a crash left between the
// snapshot and its clone (older than LeftoverAge, so that a Create still
// running keeps its own).
func (s *Store) dropLegacyCloneSnapshots(ctx context.Context, l location) ([]string, error) {
	cl, err := s.client(ctx, l)
	if err != nil {
		return nil, err
	}
	names, err := cl.ListImages(ctx, l.cephPool())
	if err != nil {
		return nil, err
	}
	var dropped []string
	var errs []error
	for _, name := range names {
		if !strings.HasPrefix(name, volumePrefix) {
			continue
		}
		r := l.ref(name)
		snaps, err := s.userSnapshots(ctx, r)
		if errdefs.KindOf(err) == errdefs.ErrNotFound {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, sn := range snaps {
			if !strings.HasPrefix(sn.Name, cloneSnapPrefix) {
				continue
			}
			children, err := cl.Children(ctx, r.cephImage(), sn.Name)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if len(children) > 0 || (!sn.Protected && s.clock().Sub(sn.Created) < LeftoverAge) {
				continue
			}
			if sn.Protected {
				if _, err := s.unprotect(ctx, r, sn.Name); err != nil {
					errs = append(errs, err)
					continue
				}
			}
			if err := cl.RemoveSnapshot(ctx, r.cephImage(), sn.Name); err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
				errs = append(errs, err)
				continue
			}
			dropped = append(dropped, "removed snapshot "+r.at(sn.Name)+" that no clone uses any more")
		}
	}
	return dropped, errors.Join(errs...)
}
