package rbd

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// nodeRegistryObject is the RADOS object whose omap holds the registered
// nodes (Config.NodeRegistry), one key per node ID, a JSON NodeInfo each.
const nodeRegistryObject = "spindle.nodes"

// RegisterNode records a node in this process and, with NodeRegistry, in
// the pool. Without NodeRegistry the in-process record lets a controller
// in the same process as the node plugin (--mode=all) enforce
// MaxVolumesPerNode; a separate controller relies on the scheduler, which
// reads the same limit from NodeGetInfo.
func (s *Store) RegisterNode(ctx context.Context, info backend.NodeInfo) error {
	s.nodesMu.Lock()
	if s.nodes == nil {
		s.nodes = map[string]backend.NodeInfo{}
	}
	s.nodes[info.NodeID] = info
	s.nodesMu.Unlock()
	if !s.cfg.NodeRegistry {
		return nil
	}
	cl, err := s.client(ctx, s.ownLocation())
	if err != nil {
		return err
	}
	return cl.SetOmap(ctx, s.ownLocation().cephPool(), nodeRegistryObject, map[string][]byte{info.NodeID: []byte(mustJSON(info))})
}

// lookupNode returns what is known of a node: from the pool's registry
// (ErrNotFound when it never registered), or else this process's record
// (an unknown node is accepted, without a limit).
func (s *Store) lookupNode(ctx context.Context, nodeID string) (backend.NodeInfo, error) {
	if !s.cfg.NodeRegistry {
		s.nodesMu.Lock()
		defer s.nodesMu.Unlock()
		return s.nodes[nodeID], nil
	}
	cl, err := s.client(ctx, s.ownLocation())
	if err != nil {
		return backend.NodeInfo{}, err
	}
	b, err := cl.OmapValue(ctx, s.ownLocation().cephPool(), nodeRegistryObject, nodeID)
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return backend.NodeInfo{}, errdefs.NotFound("node %q is not registered with %s (its node plugin has not started, or cannot reach pool %s)", nodeID, s.key, s.cfg.Pool)
	}
	if err != nil {
		return backend.NodeInfo{}, err
	}
	var info backend.NodeInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return backend.NodeInfo{}, fmt.Errorf("node %q in the registry of %s: %w", nodeID, s.key, err)
	}
	return info, nil
}

// listUnlocked lists the volumes other than skipID.
func (s *Store) listUnlocked(ctx context.Context, skipID string) ([]*backend.Image, error) {
	all, err := s.List(ctx)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, img := range all {
		if img.ID != skipID {
			out = append(out, img)
		}
	}
	return out, nil
}
