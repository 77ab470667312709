package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/node"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// The health RPCs of CSI 1.13 (volume health replaced the VolumeCondition of
// earlier versions) answer from the same checks the data path relies on.

// healthProblem is one abnormal condition of a volume.
type healthProblem struct {
	status  csi.VolumeHealthErrorType
	reason  string // CamelCase, for machines and short displays
	message string
}

func volumeHealth(volumeID string, problems []healthProblem) *csi.VolumeHealth {
	h := &csi.VolumeHealth{VolumeId: volumeID}
	for _, p := range problems {
		h.HealthStatuses = append(h.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{Status: p.status, Reason: p.reason, Message: p.message})
	}
	return h
}

// imageProblems reports an image whose data is gone (DATA_LOSS) or cannot
// be checked (DEGRADED). checker may be nil.
func imageProblems(ctx context.Context, checker any, imageID string) []healthProblem {
	c, ok := checker.(backend.ImageChecker)
	if !ok {
		return nil
	}
	err := c.CheckImage(ctx, imageID)
	switch {
	case err == nil:
		return nil
	case errdefs.KindOf(err) == errdefs.ErrNotFound:
		return []healthProblem{{csi.VolumeHealthErrorType_DATA_LOSS, "ImageMissing", err.Error()}}
	default:
		return []healthProblem{{csi.VolumeHealthErrorType_DEGRADED, "ImageUnreadable", err.Error()}}
	}
}

func (s *controllerService) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	inst, err := s.d.instanceFor(id)
	if err != nil {
		return nil, err
	}
	if _, err := inst.Store.Get(ctx, id.Image); err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: volumeHealth(id.String(), imageProblems(ctx, inst.Store, id.Image))}, nil
}

// ControllerListVolumeHealth lists the volumes that have a problem, as the
// spec asks: healthy ones are left out.
func (s *controllerService) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	all, err := s.d.allImages(ctx)
	if err != nil {
		return nil, err
	}
	type entry struct {
		id       string
		problems []healthProblem
	}
	var sick []entry
	for _, e := range all {
		if ps := imageProblems(ctx, e.inst.Store, e.img.ID); len(ps) > 0 {
			sick = append(sick, entry{e.id, ps})
		}
	}
	page, next, err := pageOf(s.d, sick, func(e entry) string { return e.id }, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &csi.ControllerListVolumeHealthResponse{NextToken: next}
	for _, e := range page {
		resp.Entries = append(resp.Entries, volumeHealth(e.id, e.problems))
	}
	return resp, nil
}

// NodeGetStorageHealth reports each backend this node cannot use.
func (s *nodeService) NodeGetStorageHealth(ctx context.Context, _ *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	resp := &csi.NodeGetStorageHealthResponse{}
	for _, key := range s.d.instanceKeys() {
		if err := s.d.instances[key].Attacher.Probe(ctx); err != nil {
			resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{
				Status:  csi.StorageHealthErrorType_STORAGE_UNREACHABLE,
				Reason:  "BackendUnreachable",
				Message: "backend " + key + ": " + err.Error(),
			})
		}
	}
	return resp, nil
}

// nodeHealthStatus maps the node data path's findings to CSI health types:
// a filesystem the kernel made read-only still serves reads (DEGRADED);
// everything else keeps the pod from its data (INACCESSIBLE).
func nodeHealthStatus(reason string) csi.VolumeHealthErrorType {
	if reason == node.ReasonFilesystemReadOnly {
		return csi.VolumeHealthErrorType_DEGRADED
	}
	return csi.VolumeHealthErrorType_INACCESSIBLE
}

// NodeGetVolumeHealth checks the volume where kubelet says it is (its
// staging path, a pod's publish path, or neither): the device attached and
// proven to be the volume's, the mounts in place and alive, the image's
// data still there.
func (s *nodeService) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	staging, publish := req.GetStagingTargetPath(), req.GetVolumePublishPath()
	var err error
	if staging != "" {
		if staging, err = s.confinePath("staging_target_path", staging); err != nil {
			return nil, err
		}
	}
	if publish != "" {
		if publish, err = s.confinePath("volume_publish_path", publish); err != nil {
			return nil, err
		}
	}
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	inst, err := s.d.instanceFor(id)
	if err != nil {
		return nil, err
	}

	var problems []healthProblem
	dev, block, err := s.stagedDevice(ctx, inst, id, staging)
	if err != nil {
		return nil, err
	}
	if publish != "" {
		if _, _, isDev, err := node.BlockDeviceAt(publish); err == nil && isDev {
			block = true // a block publish is the device node bound onto a file
		}
	}
	if dev == "" {
		problems = append(problems, healthProblem{csi.VolumeHealthErrorType_INACCESSIBLE, node.ReasonDeviceMissing,
			"volume " + id.String() + " has no device attached on node " + s.d.opts.NodeID})
	} else {
		found, err := s.d.data.CheckVolumeHealth(node.VolumeHealthCheck{Device: dev, StagingPath: staging, PublishPath: publish, Block: block})
		if err != nil {
			return nil, err
		}
		for _, p := range found {
			problems = append(problems, healthProblem{nodeHealthStatus(p.Reason), p.Reason, p.Message})
		}
	}
	problems = append(problems, imageProblems(ctx, inst.Attacher, id.Image)...)
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: volumeHealth(id.String(), problems)}, nil
}

// stagedDevice names the device the volume was staged with on this node:
// the one its stage record names, else the one under the filesystem at
// staging, else any device attached for it; "" when there is none. block
// says whether it was staged as a block volume.
func (s *nodeService) stagedDevice(ctx context.Context, inst *backend.Instance, id volumeid.ID, staging string) (dev string, block bool, err error) {
	if staging != "" {
		if rec, err := node.ReadStageRecord(staging); err == nil && rec.VolumeID == id.String() {
			return rec.Device, rec.AccessType == string(backend.AccessBlock), nil
		}
		if m, err := s.d.data.MountAt(staging); err == nil && m != nil {
			if d, err := s.mountedDevice(ctx, inst, id, m); err == nil && d != nil {
				return d.Path, false, nil
			}
		}
	}
	devs, err := inst.Attacher.Devices(ctx, id.Image)
	if err != nil {
		return "", false, err
	}
	for _, d := range devs {
		if !d.ReadOnly {
			return d.Path, false, nil
		}
	}
	if len(devs) > 0 {
		return devs[0].Path, false, nil
	}
	return "", false, nil
}
