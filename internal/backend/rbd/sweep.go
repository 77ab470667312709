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

// LeftoverAge is how old a temporary image (csi-tmp-*) or a copy snapshot
// (csi-copy-*) must be before Sweep removes it as the leftover of a
// controller that crashed in the middle of a CreateVolume or
// CreateSnapshot. A Create that is still running, in this controller or in
// another one (a leader that lost its lease mid-call), holds its
// temporaries for seconds to a few minutes (an "rbd cp" of a large volume);
// ten minutes leaves a wide margin, and a leftover costs only space until
// the next controller start.
const LeftoverAge = 10 * time.Minute

// rbdTimeLayout is how the rbd CLI prints create_timestamp and snapshot
// timestamps: ctime(3) in the local time zone of the rbd process.
const rbdTimeLayout = "Mon Jan _2 15:04:05 2006"

func parseRBDTime(s string) (time.Time, error) {
	return time.ParseInLocation(rbdTimeLayout, strings.Join(strings.Fields(s), " "), time.Local)
}

// rbdSnapTime is one entry of "rbd snap ls --format json" with its time.
type rbdSnapTime struct {
	Name      string `json:"name"`
	Timestamp string `json:"timestamp"`
}

// Sweep removes what interrupted Creates left in the pool: temporary
// images (csi-tmp-*, an image being built when its controller died) and
// copy snapshots (csi-copy-*, the instant a CSI snapshot was being copied
// from), each only when it is older than LeftoverAge by the cluster's
// creation time, so that a Create still running elsewhere is not cut. It
// returns what it removed ("pool/image", "pool/image@snap") for the log;
// what it could not remove is in the error and stays for the next start.
// The controller runs it when it opens the instance, with the instance's
// own identity (userID + keyFile, or the configFile's keyring).
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
	all, err := s.listAll(ctx, l)
	if err != nil {
		return nil, err
	}
	now := s.clock()
	var removed []string
	var errs []error
	seen := map[string]bool{}
	for _, e := range all {
		switch {
		case e.Snapshot == "" && strings.HasPrefix(e.Image, tmpPrefix):
			ok, err := s.sweepTemporary(ctx, l.ref(e.Image), now)
			if ok {
				removed = append(removed, l.ref(e.Image).spec())
			}
			errs = append(errs, err)
		case strings.HasPrefix(e.Snapshot, copySnapPrefix) && !strings.HasPrefix(e.Image, tmpPrefix) && !seen[e.Image]:
			seen[e.Image] = true
			snaps, err := s.sweepCopySnapshots(ctx, l.ref(e.Image), now)
			removed = append(removed, snaps...)
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
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
	var info rbdImage
	if err := s.on(r.location).rbdJSON(ctx, &info, "info", r.spec()); err != nil {
		if errdefs.KindOf(err) == errdefs.ErrNotFound {
			return false, nil // renamed or removed meanwhile
		}
		return false, err
	}
	at, err := parseRBDTime(info.CreateTimestamp)
	if err != nil {
		return false, fmt.Errorf("temporary image %s: create_timestamp %q: %w", r.spec(), info.CreateTimestamp, err)
	}
	if now.Sub(at) < LeftoverAge {
		return false, nil
	}
	if err := s.removeNow(ctx, r); err != nil {
		return false, fmt.Errorf("remove temporary image %s, created %s: %w", r.spec(), at.Format(time.RFC3339), err)
	}
	return true, nil
}

// sweepCopySnapshots removes the image's csi-copy-* snapshots that are old
// enough.
func (s *Store) sweepCopySnapshots(ctx context.Context, r ref, now time.Time) ([]string, error) {
	var snaps []rbdSnapTime
	if err := s.on(r.location).rbdJSON(ctx, &snaps, "snap", "ls", r.spec()); err != nil {
		if errdefs.KindOf(err) == errdefs.ErrNotFound {
			return nil, nil
		}
		return nil, err
	}
	var removed []string
	var errs []error
	for _, sn := range snaps {
		if !strings.HasPrefix(sn.Name, copySnapPrefix) {
			continue
		}
		at, err := parseRBDTime(sn.Timestamp)
		if err != nil {
			errs = append(errs, fmt.Errorf("snapshot %s: timestamp %q: %w", r.at(sn.Name), sn.Timestamp, err))
			continue
		}
		if now.Sub(at) < LeftoverAge {
			continue
		}
		spec := r.at(sn.Name)
		if _, err := s.on(r.location).rbd(ctx, "snap", "rm", "--no-progress", spec); err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
			errs = append(errs, fmt.Errorf("remove copy snapshot %s, taken %s: %w", spec, at.Format(time.RFC3339), err))
			continue
		}
		removed = append(removed, spec)
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
	all, err := s.listAll(ctx, l)
	if err != nil {
		return nil, err
	}
	var queued []string
	var errs []error
	for _, e := range all {
		if e.Snapshot != "" || e.Parent == nil || strings.HasPrefix(e.Image, tmpPrefix) {
			continue
		}
		r := l.ref(e.Image)
		out, err := s.on(l).rbd(ctx, "image-meta", "get", r.spec(), metaDepth)
		if errdefs.KindOf(err) == errdefs.ErrNotFound {
			continue // no clone of Spindle's
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if depth, err := strconv.Atoi(strings.TrimSpace(string(out))); err != nil || depth <= s.cfg.MaxCloneDepth {
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
