package driver

import (
	"maps"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/spindle-csi/spindle/internal/controller"
)

// accessibility reads a request's accessibility requirements.
func accessibility(req *csi.TopologyRequirement) *controller.Accessibility {
	if req == nil {
		return nil
	}
	a := &controller.Accessibility{}
	for _, t := range req.GetRequisite() {
		a.Requisite = append(a.Requisite, controller.Topology(maps.Clone(t.GetSegments())))
	}
	for _, t := range req.GetPreferred() {
		a.Preferred = append(a.Preferred, controller.Topology(maps.Clone(t.GetSegments())))
	}
	return a
}

func csiTopology(t controller.Topology) *csi.Topology { return &csi.Topology{Segments: t} }

func csiTopologies(ts []controller.Topology) []*csi.Topology {
	if ts == nil {
		return nil
	}
	out := make([]*csi.Topology, 0, len(ts))
	for _, t := range ts {
		out = append(out, csiTopology(t))
	}
	return out
}
