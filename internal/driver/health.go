package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
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

// NodeGetStorageHealth reports each backend this node cannot use, and an
// attach daemon the node plugin is configured with that does not answer
// (the volumes its daemons serve keep working; no new one can start).
func (s *nodeService) NodeGetStorageHealth(ctx context.Context, _ *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	resp := &csi.NodeGetStorageHealthResponse{}
	if s.d.attachDaemon != nil {
		if err := s.d.attachDaemon.Check(ctx); err != nil {
			resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{
				Status:  csi.StorageHealthErrorType_STORAGE_UNREACHABLE,
				Reason:  "AttachDaemonUnreachable",
				Message: err.Error() + "; volumes attached with rbd-nbd, rbd-fuse or iSCSI userspace cannot be staged on this node until it answers",
			})
		}
	}
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

// NodeGetVolumeHealth checks the volume where kubelet says it is (its
// staging path, a pod's publish path, or neither): the device attached and
// proven to be the volume's, the mounts in place and alive, the image's
// data still there. A filesystem the kernel made read-only still serves
// reads (DEGRADED); every other problem keeps the pod from its data
// (INACCESSIBLE).
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
	t, err := s.d.resolveNodeVolume("volume_id", req.GetVolumeId(), nil)
	if err != nil {
		return nil, err
	}
	found, err := s.d.node.Health(ctx, t.vol, staging, publish)
	if err != nil {
		return nil, err
	}
	var problems []healthProblem
	for _, p := range found {
		status := csi.VolumeHealthErrorType_INACCESSIBLE
		if p.Degraded() {
			status = csi.VolumeHealthErrorType_DEGRADED
		}
		problems = append(problems, healthProblem{status, p.Reason, p.Message})
	}
	problems = append(problems, imageProblems(ctx, t.vol.Attacher, t.vol.Image)...)
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: volumeHealth(t.id, problems)}, nil
}
