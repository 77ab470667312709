package controller

import (
	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// TopologyKey is the one topology segment Spindle reports: the node a
// node-local backend instance's images live on.
const TopologyKey = "topology.spindle.csi.dev/node"

// Topology is one topology: its segments, key to value.
type Topology map[string]string

// NodeTopology is the topology of the node nodeID.
func NodeTopology(nodeID string) Topology { return Topology{TopologyKey: nodeID} }

// Accessibility is where a new volume or snapshot must be usable from
// (CSI's TopologyRequirement): one of Requisite, or when none is given, one
// of Preferred.
type Accessibility struct {
	Requisite, Preferred []Topology
}

// accessibleTopology is where an instance's volumes and snapshots can be
// used: this node for a node-local instance, anywhere (nil) otherwise.
func (c *Controller) accessibleTopology(inst *backend.Instance) []Topology {
	if !inst.NodeLocal {
		return nil
	}
	return []Topology{NodeTopology(c.nodeID)}
}

// checkAccessibility refuses a request a node-local instance cannot meet:
// it can only provision on this node, so this node must be among the
// requisite topologies (or the preferred ones, when no requisite is given).
// A shared instance is accessible everywhere and meets any requirement.
func (c *Controller) checkAccessibility(inst *backend.Instance, req *Accessibility, field string) error {
	if !inst.NodeLocal || req == nil {
		return nil
	}
	candidates := req.Requisite
	if len(candidates) == 0 {
		candidates = req.Preferred
	}
	if len(candidates) == 0 {
		return nil
	}
	for _, t := range candidates {
		if c.includesNode(t) {
			return nil
		}
	}
	return errdefs.Exhausted("%s: backend %s keeps volumes on the node that serves it (%s=%s), which none of the requested topologies includes",
		field, inst.Key(), TopologyKey, c.nodeID)
}

// includesNode reports whether t names this node: its node segment is this
// node's, and it has no segment Spindle does not know (a zone segment would
// be a promise the driver cannot check).
func (c *Controller) includesNode(t Topology) bool {
	for k, v := range t {
		if k != TopologyKey || v != c.nodeID {
			return false
		}
	}
	return len(t) > 0
}
