package driver

import (
	"context"
	"path/filepath"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/controller"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/node"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// The node service translates CSI to the node side (internal/node's
// Volumes): it validates each request, confines its paths before the
// volume is looked up, takes the volume's lock, calls, and lets the one
// error mapping turn the result into a code. What is at a path and whose it
// is, and everything done there, is the node side's.

type nodeService struct {
	csi.UnimplementedNodeServer
	d *Driver
}

// nodeCapabilities is the node half of the capability matrix.
var nodeCapabilities = []csi.NodeServiceCapability_RPC_Type{
	csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
	csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
	csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
	csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
	csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH,
}

func (s *nodeService) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	caps := make([]*csi.NodeServiceCapability, 0, len(nodeCapabilities))
	for _, c := range nodeCapabilities {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{
			Rpc: &csi.NodeServiceCapability_RPC{Type: c},
		}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (s *nodeService) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	resp := &csi.NodeGetInfoResponse{NodeId: s.d.opts.NodeID, MaxVolumesPerNode: s.d.opts.MaxVolumesPerNode}
	if s.d.instances.NodeLocal() {
		resp.AccessibleTopology = csiTopology(controller.NodeTopology(s.d.opts.NodeID))
	}
	return resp, nil
}

// parseReadOnly reads the controller's read-only grant from publish_context.
func parseReadOnly(pc map[string]string) (bool, error) {
	v, ok := pc[backend.ContextReadOnly]
	if !ok {
		return false, nil
	}
	ro, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.InvalidArgument("publish_context.%s %q is not a boolean", backend.ContextReadOnly, v)
	}
	return ro, nil
}

// confinePath validates a path of a Node request and confines it to the
// node plugin's roots: the path it returns, with its parents' symlinks
// resolved, is the one every later step uses. This runs before the volume
// is looked up, so a request for a volume that does not exist is checked
// the same way.
func (s *nodeService) confinePath(field, p string) (string, error) {
	if err := validatePath(field, p); err != nil {
		return "", err
	}
	return s.d.node.Confine(field, filepath.Clean(p))
}

// confineVolumePath confines the volume_path of the read-only RPCs (stats,
// expansion). A relative path is no mount of any volume: NOT_FOUND, as the
// CSI spec has it, and nothing looks at it.
func (s *nodeService) confineVolumePath(volumeID, p string) (string, error) {
	if p == "" {
		return "", errdefs.InvalidArgument("volume_path is required")
	}
	if !filepath.IsAbs(p) {
		return "", errdefs.NotFound("volume_path %q is not an absolute path, so it is no mount of volume %.64q", p, volumeID)
	}
	return s.confinePath("volume_path", p)
}

// volume is the node side's handle of a volume whose ID was parsed.
func volume(id volumeid.ID, inst *backend.Instance) node.Volume {
	return node.Volume{ID: id.String(), Image: id.Image, Attacher: inst.Attacher}
}

// lockNodeVolume resolves a node request's volume_id (a Spindle volume ID
// or a pre-provisioned volume's handle, static.go), takes its node lock and
// returns its handle.
func (d *Driver) lockNodeVolume(raw string, attrs map[string]string) (nodeTarget, func(), error) {
	t, err := d.resolveNodeVolume("volume_id", raw, attrs)
	if err != nil {
		return nodeTarget{}, nil, err
	}
	release, err := d.lockNode(t)
	if err != nil {
		return nodeTarget{}, nil, err
	}
	return t, release, nil
}

func (s *nodeService) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	staging, err := s.confinePath("staging_target_path", req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	c, err := parseCapability("volume_capability", req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	if _, err := lookupVolumeID("volume_id", req.GetVolumeId()); err != nil && !backend.IsStatic(req.GetVolumeContext()) {
		return nil, err
	}
	readOnly, err := parseReadOnly(req.GetPublishContext())
	if err != nil {
		return nil, err
	}
	mkfsOptions, err := mkfsOptionsFromContext(req.GetVolumeContext())
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_context")
	}
	// Resolved first: a pre-provisioned volume that says it is encrypted
	// is refused for what it is (static.go), not for the key that no
	// controller could have handed it.
	t, release, err := s.d.lockNodeVolume(req.GetVolumeId(), req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	defer release()
	encryption, err := s.d.stageEncryption(req.GetPublishContext(), req.GetVolumeContext(), req.GetSecrets())
	if err != nil {
		return nil, err
	}
	if t.static != nil {
		// Recorded first: whatever this stage leaves, the unstage that
		// follows finds the image.
		if err := s.d.node.RecordStatic(*t.static); err != nil {
			return nil, err
		}
	}
	err = s.d.node.Stage(ctx, node.StageRequest{
		Volume: t.vol, StagingPath: staging, Access: c.Access, Mode: c.Mode, FsType: c.FsType, MountFlags: c.mountFlags,
		ReadOnly: readOnly, MkfsOptions: mkfsOptions, PublishContext: req.GetPublishContext(), Encryption: encryption,
	})
	if err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

func (s *nodeService) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	staging, err := s.confinePath("staging_target_path", req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	t, release, err := s.d.lockNodeVolume(req.GetVolumeId(), nil)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := s.d.node.Unstage(ctx, t.vol, staging); err != nil {
		return nil, err
	}
	if t.static != nil {
		if err := s.d.node.ForgetStatic(t.id); err != nil {
			return nil, err
		}
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

func (s *nodeService) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	target, err := s.confinePath("target_path", req.GetTargetPath())
	if err != nil {
		return nil, err
	}
	// This driver stages, so the staging path is where the volume is.
	staging, err := s.confinePath("staging_target_path", req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	c, err := parseCapability("volume_capability", req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	t, release, err := s.d.lockNodeVolume(req.GetVolumeId(), req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	defer release()
	err = s.d.node.Publish(ctx, node.PublishRequest{
		Volume: t.vol, StagingPath: staging, TargetPath: target, Access: c.Access, Mode: c.Mode,
		ReadOnly: req.GetReadonly(), PublishContext: req.GetPublishContext(),
	})
	if err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (s *nodeService) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	target, err := s.confinePath("target_path", req.GetTargetPath())
	if err != nil {
		return nil, err
	}
	t, release, err := s.d.lockNodeVolume(req.GetVolumeId(), nil)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := s.d.node.Unpublish(ctx, t.vol, target); err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func (s *nodeService) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	path, err := s.confineVolumePath(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	t, err := s.d.resolveNodeVolume("volume_id", req.GetVolumeId(), nil)
	if err != nil {
		return nil, err
	}
	st, err := s.d.node.Stats(ctx, t.vol, path)
	if err != nil {
		return nil, err
	}
	if st.Block {
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: st.SizeBytes}}}, nil
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: st.TotalBytes, Used: st.UsedBytes, Available: st.AvailableBytes},
		{Unit: csi.VolumeUsage_INODES, Total: st.TotalInodes, Used: st.UsedInodes, Available: st.AvailableInodes},
	}}, nil
}

// NodeExpandVolume makes the node see an expanded image: the device is
// refreshed to the image's size and the filesystem on it grown.
func (s *nodeService) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	path, err := s.confineVolumePath(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	staging := req.GetStagingTargetPath()
	if staging != "" {
		if staging, err = s.confinePath("staging_target_path", staging); err != nil {
			return nil, err
		}
	}
	if req.GetVolumeCapability() != nil {
		if _, err := parseCapability("volume_capability", req.GetVolumeCapability()); err != nil {
			return nil, err
		}
	}
	if r := req.GetCapacityRange(); r != nil {
		if _, err := controller.ResolveCapacity(r.GetRequiredBytes(), r.GetLimitBytes(), 0); err != nil {
			return nil, err
		}
	}
	t, release, err := s.d.lockNodeVolume(req.GetVolumeId(), nil)
	if err != nil {
		return nil, err
	}
	defer release()
	size, err := s.d.node.Expand(ctx, t.vol, path, staging, req.GetCapacityRange().GetRequiredBytes())
	if err != nil {
		return nil, err
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}
