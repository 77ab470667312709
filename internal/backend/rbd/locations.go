package rbd

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// The locations an instance has images in. StorageClasses put volumes in
// any pool and namespace of the clusters an instance serves, so listing
// its volumes and its upkeep (sweeping crash leftovers, emptying the
// trash, flattening deep chains) need to know where to look. The instance
// remembers every location it creates an image in: in this process, and,
// for its own cluster, in the omap of the RADOS object "spindle.locations"
// in its own pool (one key per location), so that a restarted controller
// finds them again. Its own pool is always one of them.

// locationsObject is the RADOS object whose omap keys are the locations.
const locationsObject = "spindle.locations"

// knownLocations is what this process has seen.
type knownLocations struct {
	mu   sync.Mutex
	seen map[location]bool
}

// ownLocation is the instance's own pool in its own cluster.
func (s *Store) ownLocation() location {
	return location{cluster: s.cfg.ClusterID, pool: s.cfg.Pool}
}

// locationKey is a location as an omap key: "pool/namespace" (the cluster
// is the own one).
func locationKey(l location) string { return l.pool + "/" + l.namespace }

// rememberLocation records l before an image is created there; a location
// in the own cluster is written to its omap, with the request's
// credentials, once per process.
func (s *Store) rememberLocation(ctx context.Context, l location) error {
	if l == s.ownLocation() {
		return nil
	}
	s.known.mu.Lock()
	seen := s.known.seen[l]
	s.known.mu.Unlock()
	if seen {
		return nil
	}
	if l.cluster == s.cfg.ClusterID {
		own := s.ownLocation()
		cl, err := s.client(ctx, own)
		if err == nil {
			err = cl.SetOmap(ctx, own.cephPool(), locationsObject, map[string][]byte{locationKey(l): nil})
		}
		if err != nil {
			return fmt.Errorf("record location %s in %s/%s: %w", l, own.pool, locationsObject, err)
		}
	}
	s.known.mu.Lock()
	if s.known.seen == nil {
		s.known.seen = map[location]bool{}
	}
	s.known.seen[l] = true
	s.known.mu.Unlock()
	return nil
}

// locations lists every location the instance has images in: its own
// pool, those recorded in its own cluster, and those this process has
// seen in other clusters.
func (s *Store) locations(ctx context.Context) ([]location, error) {
	locs, err := s.maintainedLocations(ctx)
	if err != nil {
		return nil, err
	}
	s.known.mu.Lock()
	for l := range s.known.seen {
		if !slices.Contains(locs, l) {
			locs = append(locs, l)
		}
	}
	s.known.mu.Unlock()
	sortLocations(locs)
	return locs, nil
}

// maintainedLocations are the locations of the instance's own cluster,
// which its own identity maintains: its own pool and those recorded.
func (s *Store) maintainedLocations(ctx context.Context) ([]location, error) {
	own := s.ownLocation()
	cl, err := s.client(ctx, own)
	if err != nil {
		return nil, err
	}
	keys, err := cl.OmapKeys(ctx, own.cephPool(), locationsObject)
	if err != nil {
		return nil, err
	}
	locs := []location{own}
	for _, key := range keys {
		pool, ns, _ := strings.Cut(key, "/")
		l := location{cluster: own.cluster, pool: pool, namespace: ns}
		if poolRe.MatchString(pool) && (ns == "" || namespaceRe.MatchString(ns)) && !slices.Contains(locs, l) {
			locs = append(locs, l)
		}
	}
	sortLocations(locs)
	return locs, nil
}

func sortLocations(locs []location) {
	slices.SortFunc(locs, func(a, b location) int { return strings.Compare(a.String(), b.String()) })
}
