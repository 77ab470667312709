package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/spindle-csi/spindle/internal/controller"
)

// The health RPCs of CSI 1.13 (volume health replaced the VolumeCondition of
// earlier versions) answer from the same checks the data path relies on.

// healthStatuses are the CSI statuses of the controller side's.
var healthStatuses = map[controller.HealthStatus]csi.VolumeHealthErrorType{
	controller.Inaccessible: csi.VolumeHealthErrorType_INACCESSIBLE,
	controller.Degraded:     csi.VolumeHealthErrorType_DEGRADED,
	controller.DataLoss:     csi.VolumeHealthErrorType_DATA_LOSS,
}

func volumeHealth(volumeID string, problems []controller.HealthProblem) *csi.VolumeHealth {
	h := &csi.VolumeHealth{VolumeId: volumeID}
	for _, p := range problems {
		h.HealthStatuses = append(h.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{Status: healthStatuses[p.Status], Reason: p.Reason, Message: p.Message})
	}
	return h
}

func (s *controllerService) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	problems, err := s.d.ctrl.VolumeHealth(ctx, id)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: volumeHealth(id.String(), problems)}, nil
}

// ControllerListVolumeHealth lists the volumes that have a problem, as the
// spec asks: healthy ones are left out.
func (s *controllerService) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	sick, err := s.d.ctrl.ListVolumeHealth(ctx)
	if err != nil {
		return nil, err
	}
	page, next, err := pageOf(s.d, sick, func(h controller.VolumeHealth) string { return h.VolumeID }, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &csi.ControllerListVolumeHealthResponse{NextToken: next}
	for _, h := range page {
		resp.Entries = append(resp.Entries, volumeHealth(h.VolumeID, h.Problems))
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
	for _, key := range s.d.instances.Keys() {
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
	var problems []controller.HealthProblem
	for _, p := range found {
		status := controller.Inaccessible
		if p.Degraded() {
			status = controller.Degraded
		}
		problems = append(problems, controller.HealthProblem{Status: status, Reason: p.Reason, Message: p.Message})
	}
	problems = append(problems, controller.ImageHealth(ctx, t.vol.Attacher, t.vol.Image)...)
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: volumeHealth(t.id, problems)}, nil
}
