package driver

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

type controllerService struct {
	csi.UnimplementedControllerServer
	d *Driver
}

// controllerCapabilities is the controller half of the capability matrix:
// only what works end to end.
var controllerCapabilities = []csi.ControllerServiceCapability_RPC_Type{
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
	csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
	csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
	csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
	csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
	csi.ControllerServiceCapability_RPC_GET_VOLUME,
	csi.ControllerServiceCapability_RPC_GET_CAPACITY,
	csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
	csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
	csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
	csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
	csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
}

func (s *controllerService) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	caps := make([]*csi.ControllerServiceCapability, 0, len(controllerCapabilities))
	for _, c := range controllerCapabilities {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: c},
		}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (s *controllerService) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := validateName("name", req.GetName()); err != nil {
		return nil, err
	}
	caps, err := parseCapabilities("volume_capabilities", req.GetVolumeCapabilities())
	if err != nil {
		return nil, err
	}
	params, err := s.d.parseParameters(req.GetParameters())
	if err != nil {
		return nil, err
	}
	if caps, err = withFsType(caps, params.fsType); err != nil {
		return nil, err
	}
	inst := s.d.instances[params.instance]
	for i, c := range caps {
		if err := inst.Exporter.SupportsAccess(c.accessType, c.mode); err != nil {
			return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_capabilities[%d]", i)
		}
	}
	if err := s.d.checkAccessibility(inst, req.GetAccessibilityRequirements(), "accessibility_requirements"); err != nil {
		return nil, err
	}
	source, err := s.resolveSource(ctx, inst, req.GetVolumeContentSource())
	if err != nil {
		return nil, err
	}

	spec, err := volumeSpec(req, caps[0], params, source)
	if err != nil {
		return nil, err
	}
	release, err := s.d.locks.acquire("create/"+req.GetName(), "volume name "+req.GetName())
	if err != nil {
		return nil, err
	}
	defer release()
	// A retried CreateVolume wraps a passphrase again, and the store
	// answers the volume with the key it was created with.
	if spec.Encryption, err = s.d.newVolumeEncryption(ctx, req.GetName(), params, source); err != nil {
		return nil, err
	}

	img, err := inst.Store.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	vol, err := s.d.csiVolume(inst, img)
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: vol}, nil
}

// withFsType gives mount capabilities that name no filesystem the one of
// parameters csi.storage.k8s.io/fstype; one that names another is refused.
func withFsType(caps []capability, fsType string) ([]capability, error) {
	if fsType == "" {
		return caps, nil
	}
	for i := range caps {
		switch {
		case caps[i].accessType != backend.AccessMount:
		case caps[i].fsType == "":
			caps[i].fsType = fsType
		case caps[i].fsType != fsType:
			return nil, errdefs.InvalidArgument("volume_capabilities[%d].mount.fs_type %q and parameters.%s %q disagree", i, caps[i].fsType, paramFsType, fsType)
		}
	}
	return caps, nil
}

// volumeSpec is what the store is asked for: the first capability's
// access type and filesystem (a copy keeps its source's), and a size that
// fits the request, the filesystem's minimum and the source.
func volumeSpec(req *csi.CreateVolumeRequest, c capability, params volumeParameters, source *contentSource) (backend.VolumeSpec, error) {
	spec := backend.VolumeSpec{
		Name:              req.GetName(),
		RequiredBytes:     req.GetCapacityRange().GetRequiredBytes(),
		LimitBytes:        req.GetCapacityRange().GetLimitBytes(),
		AccessType:        c.accessType,
		Parameters:        params.shaping,
		MutableParameters: req.GetMutableParameters(),
	}
	var minBytes int64
	if spec.AccessType == backend.AccessMount {
		spec.FsType = c.fsType
		if spec.FsType == "" && source != nil {
			spec.FsType = source.fsType // a copy keeps the filesystem it holds
		}
		fs, err := blockdev.LookupFilesystem(spec.FsType)
		if err != nil {
			return spec, err
		}
		spec.FsType, minBytes = fs.Name, fs.MinBytes
	}
	if params.encrypted {
		// The filesystem lives on the dm-crypt mapping, after the LUKS2 header.
		minBytes += blockdev.LUKSHeaderBytes
	}
	capacity := req.GetCapacityRange()
	if source != nil {
		spec.Source = &source.ContentSource
		// A copy is at least as big as what it copies; without a size it
		// is exactly as big.
		if required := capacity.GetRequiredBytes(); required == 0 {
			capacity = &csi.CapacityRange{RequiredBytes: source.sizeBytes, LimitBytes: capacity.GetLimitBytes()}
		}
		if limit := capacity.GetLimitBytes(); limit > 0 && limit < source.sizeBytes {
			return spec, errdefs.OutOfRange("capacity_range.limit_bytes %d is smaller than the %d-byte source %s", limit, source.sizeBytes, source.id)
		}
	}
	var err error
	if spec.CapacityBytes, err = resolveCapacity(capacity, minBytes); err != nil {
		return spec, err
	}
	if source != nil && spec.CapacityBytes < source.sizeBytes {
		return spec, errdefs.OutOfRange("a volume of %d bytes cannot hold its %d-byte source %s", spec.CapacityBytes, source.sizeBytes, source.id)
	}
	return spec, nil
}

// contentSource is a validated volume_content_source and what the new
// volume inherits from it.
type contentSource struct {
	backend.ContentSource
	id         string // the CSI ID, for messages
	sizeBytes  int64
	accessType backend.AccessType
	fsType     string
	encryption *backend.Encryption
}

// resolveSource validates a content source and looks it up. A source that
// cannot exist (not a Spindle ID) or does not exist is NOT_FOUND; one in
// another backend instance is INVALID_ARGUMENT, since images are copied
// within a pool.
func (s *controllerService) resolveSource(ctx context.Context, inst *backend.Instance, cs *csi.VolumeContentSource) (*contentSource, error) {
	if cs == nil {
		return nil, nil
	}
	var field, raw string
	switch t := cs.GetType().(type) {
	case *csi.VolumeContentSource_Snapshot:
		field, raw = "volume_content_source.snapshot.snapshot_id", t.Snapshot.GetSnapshotId()
	case *csi.VolumeContentSource_Volume:
		field, raw = "volume_content_source.volume.volume_id", t.Volume.GetVolumeId()
	default:
		return nil, errdefs.InvalidArgument("volume_content_source must name a snapshot or a volume")
	}
	if raw == "" {
		return nil, errdefs.InvalidArgument("%s is required", field)
	}
	id, err := volumeid.Parse(raw)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrNotFound, err, "%s %q names no Spindle volume or snapshot", field, raw)
	}
	if id.InstanceKey() != inst.Key() {
		return nil, errdefs.InvalidArgument("%s %q is in backend %s; a copy is made within one backend instance, and this volume goes to %s", field, raw, id.InstanceKey(), inst.Key())
	}
	out := &contentSource{id: raw}
	if _, ok := cs.GetType().(*csi.VolumeContentSource_Snapshot); ok {
		if inst.Snapshots == nil {
			return nil, errdefs.InvalidArgument("backend %s takes no snapshots", inst.Key())
		}
		snap, err := inst.Snapshots.GetSnapshot(ctx, id.Image)
		if err != nil {
			return nil, err
		}
		out.SnapshotID, out.sizeBytes, out.accessType, out.fsType, out.encryption = snap.ID, snap.SizeBytes, snap.AccessType, snap.FsType, snap.Encryption
		return out, nil
	}
	img, err := inst.Store.Get(ctx, id.Image)
	if err != nil {
		return nil, err
	}
	out.ImageID, out.sizeBytes, out.accessType, out.fsType, out.encryption = img.ID, img.CapacityBytes, img.AccessType, img.FsType, img.Encryption
	return out, nil
}

// csiVolume describes an image as CreateVolume, ListVolumes and
// ControllerGetVolume return it.
func (d *Driver) csiVolume(inst *backend.Instance, img *backend.Image) (*csi.Volume, error) {
	id, err := volumeid.New(inst.Type, inst.Name, img.ID)
	if err != nil {
		return nil, err
	}
	vol := &csi.Volume{
		VolumeId:           id.String(),
		CapacityBytes:      img.CapacityBytes,
		VolumeContext:      maps.Clone(img.Parameters),
		AccessibleTopology: d.accessibleTopology(inst),
	}
	if img.Encryption != nil {
		// A copy of an encrypted source is encrypted whatever its
		// StorageClass said.
		if vol.VolumeContext == nil {
			vol.VolumeContext = map[string]string{}
		}
		vol.VolumeContext[paramEncrypted] = "true"
		vol.VolumeContext[paramEncryptionKMSID] = img.Encryption.KMSID
	}
	if src := img.Source; src != nil {
		switch {
		case src.SnapshotID != "":
			vol.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
				Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: inst.Key() + "/" + src.SnapshotID},
			}}
		case src.ImageID != "":
			vol.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
				Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: inst.Key() + "/" + src.ImageID},
			}}
		}
	}
	return vol, nil
}

func (s *controllerService) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, errdefs.InvalidArgument("volume_id is required")
	}
	id, err := volumeid.Parse(req.GetVolumeId())
	if err != nil {
		// No Spindle volume can have this ID, so there is nothing to delete,
		// and the spec asks for success when the volume does not exist.
		s.d.log.Warn("DeleteVolume of an ID that is not a Spindle volume ID; nothing to delete",
			zap.String("volumeID", req.GetVolumeId()), zap.Error(err))
		return &csi.DeleteVolumeResponse{}, nil
	}
	// An ID that is ours but whose backend is not configured here is an
	// error: answering "deleted" would make Kubernetes forget an image
	// that still exists.
	inst, release, err := s.d.lockVolume("volume", id)
	if err != nil {
		return nil, err
	}
	defer release()
	// An encrypted volume's key goes first, once nothing holds the volume:
	// deleting the image first could leave a key no retry finds again.
	// An image already gone is the backend's Delete to answer; any other
	// failure to read it is this call's answer (trying the delete anyway
	// would spend a second timeout on a cluster that did not answer).
	img, err := inst.Store.Get(ctx, id.Image)
	switch {
	case err == nil && img.Encryption != nil && len(img.Attachments) == 0:
		if err := s.d.forgetKey(ctx, img.Encryption); err != nil {
			return nil, err
		}
	case err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound:
		return nil, err
	}
	if err := inst.Store.Delete(ctx, id.Image); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

func (s *controllerService) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := validateNodeID("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	c, err := parseCapability("volume_capability", req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if errdefs.KindOf(err) == errdefs.ErrNotFound && isStatic(req.GetVolumeContext()) {
		return s.publishStatic(req, c)
	}
	if err != nil {
		return nil, err
	}
	inst, err := s.d.instanceFor(id)
	if err != nil {
		return nil, err
	}
	if err := inst.Exporter.SupportsAccess(c.accessType, c.mode); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_capability")
	}
	release, err := s.d.locks.acquire("publish/"+id.String()+"/"+req.GetNodeId(), "volume "+id.String()+" on node "+req.GetNodeId())
	if err != nil {
		return nil, err
	}
	defer release()

	img, err := inst.Store.Get(ctx, id.Image)
	if err != nil {
		return nil, err
	}
	if err := checkCapabilityFits(img, c); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_capability")
	}
	pc, err := inst.Exporter.Publish(ctx, id.Image, backend.Attachment{
		NodeID:     req.GetNodeId(),
		AccessMode: c.mode,
		ReadOnly:   req.GetReadonly() || c.mode.ReadOnly(),
		Since:      time.Now().UTC().Truncate(time.Second),
	})
	if err != nil {
		return nil, err
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: addEncryptionContext(pc, img.Encryption)}, nil
}

// publishStatic publishes a pre-provisioned volume (static.go): the node
// is told where the image is; nothing is granted or recorded, so the
// volume's exclusive use rests on the attach-detach controller and on the
// node's check of the image's watchers before a read-write map.
func (s *controllerService) publishStatic(req *csi.ControllerPublishVolumeRequest, c capability) (*csi.ControllerPublishVolumeResponse, error) {
	inst, sv, image, err := s.d.staticInstance("volume_id", req.GetVolumeId(), req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	if err := inst.Exporter.SupportsAccess(c.accessType, c.mode); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_capability")
	}
	pc, err := sv.StaticPublishContext(image, req.GetVolumeContext())
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_context")
	}
	if req.GetReadonly() || c.mode.ReadOnly() {
		pc[backend.ContextReadOnly] = "true"
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: pc}, nil
}

// checkCapabilityFits refuses a capability the volume was not made for: a
// block volume's raw data must not be formatted over, and a filesystem
// volume keeps its fs type.
func checkCapabilityFits(img *backend.Image, c capability) error {
	if img.AccessType != c.accessType {
		return errdefs.InvalidArgument("volume %s was created for %s access, not %s", img.ID, img.AccessType, c.accessType)
	}
	if c.fsType != "" && img.FsType != "" && c.fsType != img.FsType {
		return errdefs.InvalidArgument("volume %s holds %s, not %s", img.ID, img.FsType, c.fsType)
	}
	return nil
}

func (s *controllerService) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if req.GetNodeId() != "" {
		if err := validateNodeID("node_id", req.GetNodeId()); err != nil {
			return nil, err
		}
	}
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		// No Spindle volume has this ID, so no node holds it: it is
		// unpublished everywhere, and the spec asks for success.
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	inst, err := s.d.instanceFor(id)
	if err != nil {
		return nil, err
	}
	release, err := s.d.locks.acquire("publish/"+id.String()+"/"+req.GetNodeId(), "volume "+id.String()+" on node "+req.GetNodeId())
	if err != nil {
		return nil, err
	}
	defer release()

	nodes := []string{req.GetNodeId()}
	if req.GetNodeId() == "" {
		// The spec: without a node, unpublish from every node.
		img, err := inst.Store.Get(ctx, id.Image)
		if errors.Is(err, errdefs.ErrNotFound) {
			return &csi.ControllerUnpublishVolumeResponse{}, nil
		}
		if err != nil {
			return nil, err
		}
		nodes = nodes[:0]
		for _, a := range img.Attachments {
			nodes = append(nodes, a.NodeID)
		}
	}
	for _, n := range nodes {
		if err := inst.Exporter.Unpublish(ctx, id.Image, n); err != nil {
			return nil, err
		}
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

func (s *controllerService) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, errdefs.InvalidArgument("volume_capabilities is required")
	}
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	inst, err := s.d.instanceFor(id)
	if err != nil {
		return nil, err
	}
	img, err := inst.Store.Get(ctx, id.Image)
	if err != nil {
		return nil, err
	}
	if _, err := s.d.parseParameters(req.GetParameters()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	for i, vc := range req.GetVolumeCapabilities() {
		field := "volume_capabilities[" + strconv.Itoa(i) + "]"
		c, err := parseCapability(field, vc)
		if err == nil {
			if err = inst.Exporter.SupportsAccess(c.accessType, c.mode); err == nil {
				err = checkCapabilityFits(img, c)
			}
			if err != nil {
				err = errdefs.Wrap(errdefs.ErrInvalidArgument, err, "%s", field)
			}
		}
		if err != nil {
			// Unsupported is an answer, not an error: no confirmation, and why.
			return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// ControllerModifyVolume changes a volume's mutable parameters (its
// VolumeAttributesClass); the backend says which it understands, and they
// take effect when the volume is next attached.
func (s *controllerService) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	inst, release, err := s.d.lockVolume("volume", id)
	if err != nil {
		return nil, err
	}
	defer release()
	if len(req.GetMutableParameters()) == 0 {
		// Nothing to change; the volume must still exist.
		_, err := inst.Store.Get(ctx, id.Image)
		if err != nil {
			return nil, err
		}
		return &csi.ControllerModifyVolumeResponse{}, nil
	}
	if _, err := inst.Store.Modify(ctx, id.Image, req.GetMutableParameters()); err != nil {
		return nil, err
	}
	return &csi.ControllerModifyVolumeResponse{}, nil
}
