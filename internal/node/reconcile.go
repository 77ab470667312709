package node

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/opsapi"
)

// Reconcile is a node plugin's look, as it starts, at what its earlier run
// left: every stage record below Options.StageRecordsRoot checked against
// the mount table and the volume's backend (the inventory: the device
// proven to be the volume's, which for the userspace attach modes means the
// daemon serving it answers; for an encrypted volume its dm-crypt mapping
// open on that device; the staging mount alive on the mapping or the
// device; the pods' binds). A volume found whole is adopted as it is: its
// mounts, its mapping, its device and the daemon serving it stay
// untouched, and the node plugin's requests find them through the same
// record and identity checks. One that is not
// whole is logged with what is wrong and left as it is too: only kubelet
// knows whether a pod still needs it, and its next NodeStageVolume (which
// redoes what is missing) or NodeUnstageVolume (which removes what is
// left) repairs it. Reconcile changes nothing on the node.
func (v *Volumes) Reconcile(ctx context.Context, resolve func(volumeID string) (Volume, error)) (intact, damaged []opsapi.StagedVolume) {
	start := time.Now()
	staged, errs := v.Staged(ctx, resolve)
	for _, s := range staged {
		fields := []zap.Field{zap.String("volumeID", s.VolumeID), zap.String("device", s.Device),
			zap.String("stagingPath", s.StagingPath), zap.Strings("publishes", s.Publishes)}
		if s.Encrypted {
			fields = append(fields, zap.String("cryptMapping", s.CryptMapping))
		}
		if Whole(s) {
			intact = append(intact, s)
			v.log.Info("found a staged volume whole; adopted as it is", fields...)
			continue
		}
		damaged = append(damaged, s)
		v.log.Warn("found a staged volume that is not whole; left for kubelet's next stage or unstage of it",
			append(fields, zap.String("mountState", s.MountState), zap.String("deviceState", s.DeviceState), zap.String("problem", s.Problem))...)
	}
	for _, e := range errs {
		v.log.Warn("start-up reconcile could not read part of the node's state", zap.String("error", e))
	}
	v.log.Info("start-up reconcile done", zap.Int("staged", len(staged)), zap.Int("whole", len(intact)),
		zap.Int("notWhole", len(damaged)), zap.Duration("duration", time.Since(start)))
	return intact, damaged
}

// Whole reports whether the inventory found a staged volume as its stage
// left it: its device attached and proven to be the volume's, an encrypted
// volume's dm-crypt mapping open on it (the inventory's Problem says when
// it is not), and for a filesystem volume the mapping or the device
// mounted, alive, at the staging path.
func Whole(s opsapi.StagedVolume) bool {
	if s.DeviceState != opsapi.DeviceStateAttached || s.Problem != "" {
		return false
	}
	return s.AccessType == string(backend.AccessBlock) || s.MountState == MountStateMounted
}
