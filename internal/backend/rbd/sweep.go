package rbd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spindle-csi/spindle/internal/errdefs"

	"github.com/spindle-csi/spindle/internal/backend"
)

// LeftoverAge is how old a temporary image (csi-tmp-*), a copy snapshot
// (csi-copy-*) or the note of a create (spindle.creates) must be before
// Sweep takes what it names for the leftover of a controller that crashed
// in the middle of a CreateVolume or CreateSnapshot. A Create that is
// still running, in this controller or in another one (a leader that lost
// its lease mid-call), holds its temporaries for seconds; ten minutes
// leaves a wide margin, and a leftover costs only space until the next
// upkeep.
const LeftoverAge = 10 * time.Minute

// Sweep removes what interrupted Creates left in the pool: temporary
// images (csi-tmp-*, an image being built when its controller died),
// volumes made in place that never got their record (csi-vol-*, or noted
// in spindle.creates: store.go) and copy snapshots no CSI snapshot hangs
// from (csi-copy-*, the instant a CSI snapshot was being copied from),
// each only when it is older than LeftoverAge (by the cluster's creation
// time, or the note's), so that a Create still running elsewhere is not
// cut. It returns what it removed ("pool/image", "pool/image@snap") for
// the log; what it could not remove is in the error and stays for the
// next upkeep. The controller runs it when it opens the instance and
// every upkeep (Maintain), with the instance's own identity (userID +
// keyFile, or the configFile's keyring).
func (s *Store) Sweep(ctx context.Context) ([]string, error) {
	if err := s.ownIdentity(); err != nil {
		return nil, err
	}
	locs, err := s.maintainedLocations(ctx)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, l := range locs {
		r, err := s.sweep(ctx, l)
		removed = append(removed, r...)
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// ownIdentity refuses the instance's own calls (its upkeep) when it has no
// identity of its own.
func (s *Store) ownIdentity() error {
	if s.cfg.UserID == "" && s.cfg.ConfigFile == "" {
		return errdefs.Precondition("cannot maintain %s (sweep crash leftovers, empty the trash): the backend config names no userID and keyFile (nor a configFile) for the controller's own calls", s.key)
	}
	return nil
}

// sweep sweeps one location.
func (s *Store) sweep(ctx context.Context, l location) ([]string, error) {
	names, err := s.listImages(ctx, l)
	if err != nil {
		return nil, err
	}
	now := s.clock()
	removed, err := s.sweepCreates(ctx, l, now)
	errs := []error{err}
	for _, name := range names {
		r := l.ref(name)
		if strings.HasPrefix(name, tmpPrefix) {
			ok, err := s.sweepTemporary(ctx, r, now)
			if ok {
				removed = append(removed, r.spec())
			}
			errs = append(errs, err)
			continue
		}
		cl, err := s.client(ctx, l)
		if err != nil {
			return removed, err
		}
		head, err := cl.ImageHeader(ctx, r.cephImage())
		switch {
		case errdefs.KindOf(err) == errdefs.ErrNotFound:
			continue // removed meanwhile
		case err != nil:
			errs = append(errs, err)
			continue
		case strings.HasPrefix(name, volumePrefix) && cutShort(head.Metadata) && now.Sub(head.Created) >= LeftoverAge:
			gone, err := s.sweepCutShort(ctx, r)
			if gone {
				removed = append(removed, r.spec())
			}
			errs = append(errs, err)
			continue
		case head.Snapshots == 0:
			continue
		}
		snaps, err := s.sweepCopySnapshots(ctx, r, now)
		removed = append(removed, snaps...)
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// sweepCreates drops the notes of createInPlace (createsObject) older than
// LeftoverAge, and removes the image of each that a create left without
// its record.
func (s *Store) sweepCreates(ctx context.Context, l location, now time.Time) ([]string, error) {
	cl, err := s.client(ctx, l)
	if err != nil {
		return nil, err
	}
	names, err := cl.OmapKeys(ctx, l.cephPool(), createsObject)
	if err != nil || len(names) == 0 {
		return nil, err
	}
	var removed, done []string
	var errs []error
	for _, name := range names {
		v, err := cl.OmapValue(ctx, l.cephPool(), createsObject, name)
		if errdefs.KindOf(err) == errdefs.ErrNotFound {
			continue // dropped meanwhile
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if began, err := time.Parse(time.RFC3339, string(v)); err == nil && now.Sub(began) < LeftoverAge {
			continue // maybe still running
		}
		gone, err := s.sweepCutShort(ctx, l.ref(name))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if gone {
			removed = append(removed, l.ref(name).spec())
		}
		done = append(done, name)
	}
	if len(done) > 0 {
		if err := cl.RemoveOmapKeys(ctx, l.cephPool(), createsObject, done); err != nil {
			errs = append(errs, fmt.Errorf("drop the notes of creates %s in %s/%s: %w", strings.Join(done, ", "), l, createsObject, err))
		}
	}
	return removed, errors.Join(errs...)
}

// sweepCutShort removes the image a noted create left without its record,
// if it did; an image with a record, or with another object's metadata,
// stays.
func (s *Store) sweepCutShort(ctx context.Context, r ref) (bool, error) {
	defer s.locks.lock(s.idOf(r))()
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return false, err
	}
	head, err := cl.ImageHeader(ctx, r.cephImage())
	switch {
	case errdefs.KindOf(err) == errdefs.ErrNotFound:
		return false, nil
	case err != nil:
		return false, err
	case !cutShort(head.Metadata):
		return false, nil
	}
	if err := s.removeNow(ctx, r); err != nil {
		return false, fmt.Errorf("remove %s, a create cut short: %w", r.spec(), err)
	}
	return true, nil
}

// clock is the store's time (tests move it forward).
func (s *Store) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// sweepTemporary removes the temporary image if it is old enough.
func (s *Store) sweepTemporary(ctx context.Context, r ref, now time.Time) (bool, error) {
	defer s.locks.lock(s.idOf(r))()
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return false, err
	}
	info, err := cl.StatImage(ctx, r.cephImage(), "")
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return false, nil // renamed or removed meanwhile
	}
	if err != nil {
		return false, err
	}
	if now.Sub(info.Created) < LeftoverAge {
		return false, nil
	}
	if err := s.removeNow(ctx, r); err != nil {
		return false, fmt.Errorf("remove temporary image %s, created %s: %w", r.spec(), info.Created.UTC().Format(time.RFC3339), err)
	}
	return true, nil
}

// sweepCopySnapshots removes the image's csi-copy-* snapshots that are old
// enough.
func (s *Store) sweepCopySnapshots(ctx context.Context, r ref, now time.Time) ([]string, error) {
	snaps, err := s.userSnapshots(ctx, r)
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, sn := range snaps {
		if !strings.HasPrefix(sn.Name, copySnapPrefix) || now.Sub(sn.Created) < LeftoverAge {
			continue
		}
		// A CSI snapshot's image hangs from it while it lives: no leftover.
		if children, err := cl.Children(ctx, r.cephImage(), sn.Name); err != nil || len(children) > 0 {
			if err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err := cl.RemoveSnapshot(ctx, r.cephImage(), sn.Name); err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
			errs = append(errs, fmt.Errorf("remove copy snapshot %s, taken %s: %w", r.at(sn.Name), sn.Created.UTC().Format(time.RFC3339), err))
			continue
		}
		removed = append(removed, r.at(sn.Name))
	}
	return removed, errors.Join(errs...)
}

// Reconcile implements backend.Reconciler: a controller maintains the pool
// when it opens the instance.
func (s *Store) Reconcile(ctx context.Context) ([]string, error) { return s.Maintain(ctx) }

// Maintain implements backend.Maintainer, with the instance's own identity:
// it sweeps crash leftovers (Sweep), queues the removal of trashed images
// no clone needs any more (purgeTrash), and queues the flatten of every
// clone deeper than MaxCloneDepth that is not flattened yet (after a
// controller restart, or when the first attempt failed). It returns what
// it did, for the log.
func (s *Store) Maintain(ctx context.Context) ([]string, error) {
	if err := s.ownIdentity(); err != nil {
		return nil, err // no identity of its own: nothing can run
	}
	locs, err := s.maintainedLocations(ctx)
	if err != nil {
		return nil, err
	}
	var changed []string
	var errs []error
	for _, l := range locs {
		swept, err := s.sweep(ctx, l)
		purged, perr := s.purgeTrash(ctx, l)
		flattening, ferr := s.flattenDeepChains(ctx, l)
		changed = append(append(append(changed, swept...), purged...), flattening...)
		errs = append(errs, err, perr, ferr)
	}
	return changed, errors.Join(errs...)
}

// flattenDeepChains queues the flatten of every clone of a location whose
// recorded depth is beyond MaxCloneDepth and that still has a parent. A
// flatten already queued is not queued twice.
func (s *Store) flattenDeepChains(ctx context.Context, l location) ([]string, error) {
	cl, err := s.client(ctx, l)
	if err != nil {
		return nil, err
	}
	names, err := cl.ListImages(ctx, l.cephPool())
	if err != nil {
		return nil, err
	}
	var queued []string
	var errs []error
	for _, name := range names {
		if strings.HasPrefix(name, tmpPrefix) {
			continue
		}
		r := l.ref(name)
		info, meta, err := cl.DescribeImage(ctx, r.cephImage())
		if errdefs.KindOf(err) == errdefs.ErrNotFound {
			continue // removed meanwhile
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		v, ok := meta[metaDepth]
		if !ok || info.Parent == nil {
			continue // no clone of Spindle's, or flattened
		}
		if depth, err := strconv.Atoi(strings.TrimSpace(v)); err != nil || depth <= s.cfg.MaxCloneDepth {
			continue
		}
		if err := s.flattenInBackground(ctx, r); err != nil {
			errs = append(errs, fmt.Errorf("flatten %s: %w", r.spec(), err))
			continue
		}
		queued = append(queued, "flattening "+r.spec()+" in the background")
	}
	return queued, errors.Join(errs...)
}

var (
	_ backend.Reconciler = (*Store)(nil)
	_ backend.Maintainer = (*Store)(nil)
)
