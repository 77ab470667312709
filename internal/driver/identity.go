package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

type identityService struct {
	csi.UnimplementedIdentityServer
	d *Driver
}

func (s *identityService) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: s.d.opts.DriverName, VendorVersion: s.d.version}, nil
}

func (s *identityService) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	service := func(t csi.PluginCapability_Service_Type) *csi.PluginCapability {
		return &csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: t}}}
	}
	var caps []*csi.PluginCapability
	if s.d.opts.Mode.Controller() {
		caps = append(caps, service(csi.PluginCapability_Service_CONTROLLER_SERVICE))
		if s.d.ctrl.GroupSnapshots() {
			caps = append(caps, service(csi.PluginCapability_Service_GROUP_CONTROLLER_SERVICE))
		}
	}
	if s.d.instances.NodeLocal() {
		caps = append(caps,
			service(csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS),
			service(csi.PluginCapability_Service_SNAPSHOT_ACCESSIBILITY_CONSTRAINTS))
	}
	// xfs and btrfs grow while mounted; ext4 does too where the node
	// plugin has CAP_SYS_RESOURCE (and otherwise grows at the next stage).
	caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_VolumeExpansion_{
		VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_ONLINE},
	}})
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe answers ready only when every backend instance this process serves
// is reachable: its store on a controller, its attacher on a node.
func (s *identityService) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if err := s.d.probe(ctx); err != nil {
		return nil, err
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

// probe checks every backend instance this process serves; /healthz asks
// the same question as Probe.
func (d *Driver) probe(ctx context.Context) error {
	for _, key := range d.instances.Keys() {
		inst := d.instances[key]
		// FAILED_PRECONDITION is the spec's answer for a dependency that is
		// missing; the message says which backend and why.
		if d.opts.Mode.Controller() {
			if err := inst.Store.Probe(ctx); err != nil {
				return errdefs.Wrap(errdefs.ErrPrecondition, err, "backend %s is not reachable from the controller", key)
			}
		}
		if d.opts.Mode.Node() {
			if err := inst.Attacher.Probe(ctx); err != nil {
				return errdefs.Wrap(errdefs.ErrPrecondition, err, "backend %s is not usable on node %s", key, d.opts.NodeID)
			}
		}
	}
	return nil
}
