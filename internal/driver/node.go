package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/node"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

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
	if s.d.hasNodeLocal() {
		resp.AccessibleTopology = s.d.nodeTopology()
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
// node plugin's roots (node.PathGuard): the path it returns, with its
// parents' symlinks resolved, is the one every later step uses. This runs
// before the volume is looked up, so a request for a volume that does not
// exist is checked the same way.
func (s *nodeService) confinePath(field, p string) (string, error) {
	if err := validatePath(field, p); err != nil {
		return "", err
	}
	return s.d.paths.Confine(field, filepath.Clean(p))
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

// devicesOf lists the devices attached for the volume on this node.
func (s *nodeService) devicesOf(ctx context.Context, inst *backend.Instance, id volumeid.ID) (node.VolumeDevices, error) {
	devs, err := inst.Attacher.Devices(ctx, id.Image)
	if err != nil {
		return nil, err
	}
	out := make(node.VolumeDevices, 0, len(devs))
	for _, d := range devs {
		vd, err := node.NewVolumeDevice(d.Path, d.ReadOnly)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", id, err)
		}
		out = append(out, *vd)
	}
	return out, nil
}

// identify returns the device at path if the backend proves it is the
// volume's, nil when it is some other device (or none). It looks at that one
// device only, so RPCs that know which device to expect never scan.
func (s *nodeService) identify(ctx context.Context, inst *backend.Instance, id volumeid.ID, path string) (*node.VolumeDevice, error) {
	dev, err := inst.Attacher.Identify(ctx, id.Image, path)
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	vd, err := node.NewVolumeDevice(dev.Path, dev.ReadOnly)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("volume %s: %w", id, err)
	}
	return vd, nil
}

// mountedDevice returns the volume's device that the filesystem mounted as
// m lives on, or nil when m is anything else. The mount source names the
// device the kernel mounted, and a mounted device cannot be rebound, so
// proving that device proves the mount.
func (s *nodeService) mountedDevice(ctx context.Context, inst *backend.Instance, id volumeid.ID, m *node.Mount) (*node.VolumeDevice, error) {
	if !strings.HasPrefix(m.Source, "/dev/") {
		return nil, nil
	}
	d, err := s.identify(ctx, inst, id, m.Source)
	if err != nil || d == nil || !d.IsFilesystemOf(m) {
		return nil, err
	}
	return d, nil
}

// stageRequest is a validated NodeStageVolumeRequest.
type stageRequest struct {
	id             volumeid.ID
	staging        string // confined
	c              capability
	readOnly       bool // the controller's grant
	mkfsOptions    []string
	publishContext map[string]string
}

func (s *nodeService) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	r, err := s.parseStage(req)
	if err != nil {
		return nil, err
	}
	inst, release, err := s.d.lockVolume("node", r.id)
	if err != nil {
		return nil, err
	}
	defer release()

	if staged, err := s.alreadyStaged(ctx, inst, r.id, r.staging, r.c); err != nil || staged {
		return &csi.NodeStageVolumeResponse{}, err
	}
	dev, reused, err := s.attachForStage(ctx, inst, r)
	if err != nil {
		return nil, err
	}
	// From here on a failure undoes the attach: kubelet does not call
	// NodeUnstageVolume after a stage that failed, so nothing else would.
	// A device that was attached before this stage is left attached: it
	// is not this stage's to take away.
	if r.c.accessType == backend.AccessBlock {
		err = s.stageBlock(r, dev)
	} else {
		err = s.stageFilesystem(ctx, inst, r, dev)
	}
	if err != nil {
		s.rollbackStage(inst, r.id, r.staging, dev.Path, reused)
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// parseStage checks a NodeStageVolumeRequest: the required fields first,
// then the volume ID.
func (s *nodeService) parseStage(req *csi.NodeStageVolumeRequest) (stageRequest, error) {
	r := stageRequest{publishContext: req.GetPublishContext()}
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return r, err
	}
	var err error
	if r.staging, err = s.confinePath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return r, err
	}
	if err := node.CheckStagingPath("staging_target_path", r.staging); err != nil {
		return r, err
	}
	if r.c, err = parseCapability("volume_capability", req.GetVolumeCapability()); err != nil {
		return r, err
	}
	if r.id, err = lookupVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return r, err
	}
	if r.readOnly, err = parseReadOnly(req.GetPublishContext()); err != nil {
		return r, err
	}
	if r.mkfsOptions, err = mkfsOptionsFromContext(req.GetVolumeContext()); err != nil {
		return r, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_context")
	}
	return r, nil
}

// attachForStage checks that the staging path is free, then attaches the
// volume's device; reused says it was attached before this stage.
func (s *nodeService) attachForStage(ctx context.Context, inst *backend.Instance, r stageRequest) (dev *backend.Device, reused bool, err error) {
	// Before anything is attached: a staging directory that holds files
	// is refused untouched.
	if r.c.accessType == backend.AccessMount {
		err = node.PrepareMountPoint("staging_target_path", r.staging)
	} else {
		err = node.CheckEmptyStagingPath("staging_target_path", r.staging)
	}
	if err != nil {
		return nil, false, err
	}
	attached, err := s.devicesOf(ctx, inst, r.id)
	if err != nil {
		return nil, false, err
	}
	if len(attached) > 0 {
		mounts, err := s.d.data.Mounts()
		if err != nil {
			return nil, false, err
		}
		if elsewhere := attached.MountedElsewhere(mounts, r.staging); elsewhere != "" {
			return nil, false, errdefs.Precondition("volume %s is already staged on this node at %s; a volume is staged at one path per node", r.id, elsewhere)
		}
	}
	dev, err = inst.Attacher.Attach(ctx, backend.AttachRequest{
		ImageID: r.id.Image, NodeID: s.d.opts.NodeID, PublishContext: r.publishContext, ReadOnly: r.readOnly || r.c.mode.ReadOnly(),
	})
	if err != nil {
		return nil, false, err
	}
	reused = attached.ByPath(dev.Path) != nil
	if dev.AccessType != "" && dev.AccessType != r.c.accessType {
		s.rollbackStage(inst, r.id, r.staging, dev.Path, reused)
		return nil, false, errdefs.InvalidArgument("volume %s was created for %s access, not %s; staging it as %s could overwrite its data", r.id, dev.AccessType, r.c.accessType, r.c.accessType)
	}
	return dev, reused, nil
}

// stageBlock only records the device: publish binds the device itself.
func (s *nodeService) stageBlock(r stageRequest, dev *backend.Device) error {
	if err := os.MkdirAll(filepath.Dir(r.staging), 0o750); err != nil {
		return err
	}
	rec := node.StageRecord{VolumeID: r.id.String(), Device: dev.Path, AccessType: string(r.c.accessType), ReadOnly: dev.ReadOnly}
	if err := node.WriteStageRecord(r.staging, rec); err != nil {
		return fmt.Errorf("write stage record: %w", err)
	}
	return nil
}

// stageFilesystem formats the device once (never a device that holds
// anything) and mounts it at the staging path.
func (s *nodeService) stageFilesystem(ctx context.Context, inst *backend.Instance, r stageRequest, dev *backend.Device) error {
	fsName := r.c.fsType
	if fsName == "" {
		fsName = dev.FsType
	}
	if fsName == "" {
		fsName = node.DefaultFsType
	}
	fs, err := node.LookupFilesystem(fsName)
	if err != nil {
		return err
	}
	rec := node.StageRecord{VolumeID: r.id.String(), Device: dev.Path, AccessType: string(r.c.accessType), FsType: fs.Name, ReadOnly: dev.ReadOnly}
	if err := node.WriteStageRecord(r.staging, rec); err != nil {
		return fmt.Errorf("write stage record: %w", err)
	}
	formatted, err := s.d.data.StageFilesystem(ctx, node.FormatRequest{
		Device:           dev.Path,
		Filesystem:       fs,
		MkfsOptions:      r.mkfsOptions,
		AlreadyFormatted: dev.Formatted,
		ReadOnly:         dev.ReadOnly,
	}, r.staging, fs.MountOptions(r.c.mountFlags, dev.ReadOnly), func(ctx context.Context) error {
		return inst.Attacher.RecordFormatted(ctx, r.id.Image, fs.Name)
	})
	if formatted {
		s.d.log.Info("formatted volume", zap.String("volumeID", r.id.String()), zap.String("device", dev.Path), zap.String("fsType", fs.Name))
	}
	if err != nil {
		return fmt.Errorf("volume %s: %w", r.id, err)
	}
	return nil
}

// alreadyStaged reports whether the volume is staged at staging as asked
// (a retried NodeStageVolume). A dead mount there is cleaned up so the stage
// can be redone; a mount of anything else is refused.
func (s *nodeService) alreadyStaged(ctx context.Context, inst *backend.Instance, id volumeid.ID, staging string, c capability) (bool, error) {
	if c.accessType == backend.AccessBlock {
		rec, err := node.ReadStageRecord(staging)
		if err != nil || rec.VolumeID != id.String() {
			return false, nil
		}
		d, err := s.identify(ctx, inst, id, rec.Device)
		return d != nil, err
	}

	corrupted, err := node.CheckHealthy(staging)
	if err != nil && !os.IsNotExist(err) {
		return false, err
	}
	if corrupted {
		s.d.log.Warn("staging mount is dead; unmounting it to stage again", zap.String("volumeID", id.String()), zap.String("path", staging))
		if err := s.d.data.Unmount(ctx, staging); err != nil {
			return false, err
		}
		return false, nil
	}
	m, err := s.d.data.MountAt(staging)
	if err != nil || m == nil {
		return false, err
	}
	d, err := s.mountedDevice(ctx, inst, id, m)
	if err != nil {
		return false, err
	}
	if d == nil {
		return false, errdefs.Precondition("staging_target_path %s already holds another mount (%s %s), not volume %s", staging, m.FsType, m.Source, id)
	}
	if c.fsType != "" && m.FsType != c.fsType {
		return false, errdefs.AlreadyExists("volume %s is staged at %s as %s, not %s", id, staging, m.FsType, c.fsType)
	}
	return true, nil
}

// rollbackStage undoes a stage that failed part-way. Its own failures are
// logged: the caller's error is the one that matters.
func (s *nodeService) rollbackStage(inst *backend.Instance, id volumeid.ID, staging, device string, keepAttached bool) {
	ctx := context.Background()
	if m, err := s.d.data.MountAt(staging); err == nil && m != nil && m.Source == device {
		if err := s.d.data.Unmount(ctx, staging); err != nil {
			s.d.log.Error("rollback of a failed stage: unmount", zap.String("volumeID", id.String()), zap.Error(err))
			return
		}
	}
	if keepAttached {
		return
	}
	if err := inst.Attacher.Detach(ctx, id.Image, device); err != nil {
		s.d.log.Error("rollback of a failed stage: detach", zap.String("volumeID", id.String()), zap.String("device", device), zap.Error(err))
		return
	}
	if err := node.RemoveStageRecord(staging); err != nil {
		s.d.log.Error("rollback of a failed stage: remove stage record", zap.String("volumeID", id.String()), zap.Error(err))
	}
}

func (s *nodeService) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	staging, err := s.confinePath("staging_target_path", req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	if err := node.CheckStagingPath("staging_target_path", staging); err != nil {
		return nil, err
	}
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	inst, release, err := s.d.lockVolume("node", id)
	if err != nil {
		return nil, err
	}
	defer release()

	// Refuse while the volume is still published: unmounting the staging
	// path under live bind mounts would leave a device we cannot detach.
	mounts, err := s.d.data.Mounts()
	if err != nil {
		return nil, err
	}
	if m := s.publishedAt(ctx, inst, id, mounts, staging); m != "" {
		if node.TopMount(mounts, staging) == nil {
			return nil, errdefs.Precondition("volume %s is not staged at %s, but its device is mounted at %s; unpublish and unstage it where it is", id, staging, m)
		}
		return nil, errdefs.Precondition("volume %s is still published at %s; unpublish it before unstaging", id, m)
	}
	if err := s.d.data.Unmount(ctx, staging); err != nil {
		return nil, err
	}
	if err := inst.Attacher.Detach(ctx, id.Image, ""); err != nil {
		return nil, err
	}
	if err := node.RemoveStageRecord(staging); err != nil {
		return nil, fmt.Errorf("remove stage record: %w", err)
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// publishedAt returns a mount point where the volume staged at staging is
// still published, or "". A filesystem volume's publishes are the other
// mounts of the staging mount's filesystem, found without asking the
// backend; only with nothing mounted at staging are its devices listed.
func (s *nodeService) publishedAt(ctx context.Context, inst *backend.Instance, id volumeid.ID, mounts []node.Mount, staging string) string {
	var devs node.VolumeDevices
	if node.TopMount(mounts, staging) == nil {
		var err error
		if devs, err = s.devicesOf(ctx, inst, id); err != nil {
			// Detach refuses a device that is still in use, so an unreadable
			// device list cannot make Unstage cut a publish off.
			s.d.log.Warn("cannot list the volume's devices to look for publishes", zap.String("volumeID", id.String()), zap.Error(err))
			return ""
		}
	}
	return devs.PublishedAt(mounts, staging)
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
	if err := node.CheckStagingPath("staging_target_path", staging); err != nil {
		return nil, err
	}
	c, err := parseCapability("volume_capability", req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	inst, release, err := s.d.lockVolume("node", id)
	if err != nil {
		return nil, err
	}
	defer release()

	if corrupted, err := node.CheckHealthy(target); err == nil && corrupted {
		s.d.log.Warn("target mount is dead; unmounting it to publish again", zap.String("volumeID", id.String()), zap.String("path", target))
		if err := s.d.data.Unmount(ctx, target); err != nil {
			return nil, err
		}
	}
	p := publishRequest{staging: staging, target: target, readOnly: req.GetReadonly(), publishContext: req.GetPublishContext(), c: c}
	if c.accessType == backend.AccessBlock {
		err = s.publishBlock(ctx, inst, id, p)
	} else {
		err = s.publishMount(ctx, inst, id, p)
	}
	if err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// publishRequest is a NodePublishVolumeRequest with its paths confined.
type publishRequest struct {
	staging, target string
	readOnly        bool
	publishContext  map[string]string
	c               capability
}

func (s *nodeService) publishMount(ctx context.Context, inst *backend.Instance, id volumeid.ID, p publishRequest) error {
	staging, target, readOnly, c := p.staging, p.target, p.readOnly, p.c
	mounts, err := s.d.data.Mounts()
	if err != nil {
		return err
	}
	st := node.TopMount(mounts, staging)
	if st == nil {
		return errdefs.Precondition("volume %s is not staged at %s; NodeStageVolume first", id, staging)
	}
	if d, err := s.mountedDevice(ctx, inst, id, st); err != nil {
		return err
	} else if d == nil {
		return errdefs.Precondition("volume %s is not staged at %s (it holds %s %s); NodeStageVolume first", id, staging, st.FsType, st.Source)
	}
	sameVolume := func(m *node.Mount) bool { return m.Major == st.Major && m.Minor == st.Minor && m.Root == st.Root }

	if tm := node.TopMount(mounts, target); tm != nil {
		if !sameVolume(tm) {
			return errdefs.Precondition("target_path %s already holds another mount (%s %s)", target, tm.FsType, tm.Source)
		}
		switch {
		case readOnly && !tm.ReadOnly():
			// An earlier publish stopped between bind and read-only remount.
			return s.d.data.RemountReadOnly(ctx, target)
		case !readOnly && tm.ReadOnly() && !st.ReadOnly():
			return errdefs.AlreadyExists("volume %s is published read-only at %s; asked for read-write", id, target)
		}
		return nil
	}
	if c.mode == backend.SingleNodeSingleWriter {
		for i := range mounts {
			m := &mounts[i]
			if m.ID != st.ID && sameVolume(m) {
				return errdefs.Precondition("volume %s is already published at %s; access mode %s allows one", id, m.MountPoint, c.mode)
			}
		}
	}
	if err := node.PrepareMountPoint("target_path", target); err != nil {
		return err
	}
	if err := s.d.data.BindMount(ctx, staging, target, readOnly); err != nil {
		// Never leave a writable bind where a read-only one was asked for.
		if uerr := s.d.data.Unmount(ctx, target); uerr != nil {
			err = errors.Join(err, uerr)
		}
		return err
	}
	return nil
}

// stagedBlockDevice is the device the stage record at staging names, if it
// is still one of the volume's devices.
func (s *nodeService) stagedBlockDevice(id volumeid.ID, staging string, devs node.VolumeDevices) (*node.VolumeDevice, error) {
	rec, err := node.ReadStageRecord(staging)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && rec.VolumeID != id.String()) {
		return nil, errdefs.Precondition("volume %s is not staged at %s; NodeStageVolume first", id, staging)
	}
	if err != nil {
		return nil, err
	}
	d := devs.ByPath(rec.Device)
	if d == nil {
		return nil, errdefs.Precondition("device %s staged for volume %s is no longer attached; stage the volume again", rec.Device, id)
	}
	return d, nil
}

func (s *nodeService) publishBlock(ctx context.Context, inst *backend.Instance, id volumeid.ID, p publishRequest) (err error) {
	devs, err := s.devicesOf(ctx, inst, id)
	if err != nil {
		return err
	}
	staging, target, readOnly, c := p.staging, p.target, p.readOnly, p.c
	stagedDev, err := s.stagedBlockDevice(id, staging, devs)
	if err != nil {
		return err
	}
	mounts, err := s.d.data.Mounts()
	if err != nil {
		return err
	}
	// A repeated publish is answered before anything is attached, so a
	// refused one leaves no read-only view behind.
	if tm := node.TopMount(mounts, target); tm != nil {
		major, minor, isDev, err := node.BlockDeviceAt(target)
		if err != nil {
			return err
		}
		published := devs.ByNumber(major, minor)
		if !isDev || published == nil {
			return errdefs.Precondition("target_path %s already holds another mount (%s %s)", target, tm.FsType, tm.Source)
		}
		if published.ReadOnly != (readOnly || stagedDev.ReadOnly) {
			return errdefs.AlreadyExists("volume %s is published at %s with read-only=%t; asked for read-only=%t", id, target, published.ReadOnly, readOnly)
		}
		return nil
	}
	if c.mode == backend.SingleNodeSingleWriter {
		for i := range mounts {
			if devs.DeviceBind(&mounts[i]) != nil {
				return errdefs.Precondition("volume %s is already published at %s; access mode %s allows one", id, mounts[i].MountPoint, c.mode)
			}
		}
	}
	// Before a read-only view is attached: a target that is not an empty
	// file is refused untouched.
	if err := node.PrepareDeviceTarget("target_path", target); err != nil {
		return err
	}
	source := backend.Device{Path: stagedDev.Path, ReadOnly: stagedDev.ReadOnly}
	if readOnly && !source.ReadOnly {
		// A read-only bind of a device node does not stop writes to the
		// device, so a read-only publish gets a read-only device of its own.
		ro, err := inst.Attacher.Attach(ctx, backend.AttachRequest{
			ImageID: id.Image, NodeID: s.d.opts.NodeID, PublishContext: p.publishContext, ReadOnly: true,
		})
		if err != nil {
			return err
		}
		source = *ro
		defer func() {
			if err != nil {
				if derr := inst.Attacher.Detach(ctx, id.Image, source.Path); derr != nil {
					err = errors.Join(err, derr)
				}
			}
		}()
	}
	if err := s.d.data.BindMount(ctx, source.Path, target, readOnly); err != nil {
		// Never leave a writable bind where a read-only one was asked for.
		if uerr := s.d.data.Unmount(ctx, target); uerr != nil {
			err = errors.Join(err, uerr)
		}
		return err
	}
	return nil
}

func (s *nodeService) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	target, err := s.confinePath("target_path", req.GetTargetPath())
	if err != nil {
		return nil, err
	}
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	inst, release, err := s.d.lockVolume("node", id)
	if err != nil {
		return nil, err
	}
	defer release()

	_, _, wasBlock, _ := node.BlockDeviceAt(target)
	if err := s.d.data.Unmount(ctx, target); err != nil {
		return nil, err
	}
	if err := node.RemoveMountPoint("target_path", target); err != nil {
		return nil, err
	}
	if wasBlock {
		if err := s.releaseReadOnlyViews(ctx, inst, id); err != nil {
			return nil, err
		}
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// releaseReadOnlyViews detaches the read-only devices publishBlock made
// for read-only publishes once no publish uses them. The staged device is
// the writable one and stays.
func (s *nodeService) releaseReadOnlyViews(ctx context.Context, inst *backend.Instance, id volumeid.ID) error {
	devs, err := s.devicesOf(ctx, inst, id)
	if err != nil {
		return err
	}
	hasWritable := false
	for _, d := range devs {
		hasWritable = hasWritable || !d.ReadOnly
	}
	if !hasWritable {
		return nil // the staged device itself is read-only
	}
	mounts, err := s.d.data.Mounts()
	if err != nil {
		return err
	}
	used := map[string]bool{}
	for i := range mounts {
		if d := devs.DeviceBind(&mounts[i]); d != nil {
			used[d.Path] = true
		}
	}
	for _, d := range devs {
		if d.ReadOnly && !used[d.Path] {
			if err := inst.Attacher.Detach(ctx, id.Image, d.Path); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *nodeService) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	path, err := s.confineVolumePath(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	inst, err := s.d.instanceFor(id)
	if err != nil {
		return nil, err
	}
	dev, m, err := s.volumeAt(ctx, inst, id, path)
	if err != nil {
		return nil, err
	}
	if m == nil {
		size, err := blockdev.SizeOfNumber(dev.Major, dev.Minor)
		if err != nil {
			return nil, err
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}}}, nil
	}
	u, err := node.UsageOf(path)
	if err != nil {
		return nil, err
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: u.TotalBytes, Used: u.UsedBytes, Available: u.AvailableBytes},
		{Unit: csi.VolumeUsage_INODES, Total: u.TotalInodes, Used: u.UsedInodes, Available: u.AvailableInodes},
	}}, nil
}
