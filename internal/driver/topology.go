package driver

import (
	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// TopologyKey is the one topology segment Spindle reports: the node a
// node-local backend instance's images live on.
const TopologyKey = "topology.spindle.csi.dev/node"

// hasNodeLocal reports whether any instance keeps its images on this node
// only, which is when the driver reports topology at all.
func (d *Driver) hasNodeLocal() bool {
	for _, inst := range d.instances {
		if inst.NodeLocal {
			return true
		}
	}
	return false
}

// nodeTopology is this node's segment.
func (d *Driver) nodeTopology() *csi.Topology {
	return &csi.Topology{Segments: map[string]string{TopologyKey: d.opts.NodeID}}
}

// accessibleTopology is where an instance's volumes and snapshots can be
// used: this node for a node-local instance, anywhere (nil) otherwise.
func (d *Driver) accessibleTopology(inst *backend.Instance) []*csi.Topology {
	if !inst.NodeLocal {
		return nil
	}
	return []*csi.Topology{d.nodeTopology()}
}

// checkAccessibility refuses a request a node-local instance cannot meet:
// it can only provision on this node, so this node must be among the
// requisite topologies (or the preferred ones, when no requisite is given).
// A shared instance is accessible everywhere and meets any requirement.
func (d *Driver) checkAccessibility(inst *backend.Instance, req *csi.TopologyRequirement, field string) error {
	if !inst.NodeLocal || req == nil {
		return nil
	}
	candidates := req.GetRequisite()
	if len(candidates) == 0 {
		candidates = req.GetPreferred()
	}
	if len(candidates) == 0 {
		return nil
	}
	for _, t := range candidates {
		if d.topologyIncludesNode(t) {
			return nil
		}
	}
	return errdefs.Exhausted("%s: backend %s keeps volumes on the node that serves it (%s=%s), which none of the requested topologies includes",
		field, inst.Key(), TopologyKey, d.opts.NodeID)
}

// topologyIncludesNode reports whether t names this node: its node segment
// is this node's, and it has no segment Spindle does not know (a zone
// segment would be a promise the driver cannot check).
func (d *Driver) topologyIncludesNode(t *csi.Topology) bool {
	for k, v := range t.GetSegments() {
		if k != TopologyKey || v != d.opts.NodeID {
			return false
		}
	}
	return len(t.GetSegments()) > 0
}
