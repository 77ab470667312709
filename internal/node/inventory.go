package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/opsapi"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// FoundStageRecord is a stage record found on disk with the staging path it
// describes.
type FoundStageRecord struct {
	StagingPath string
	Record      StageRecord
}

// maxStageRecordDepth bounds the search below the root: kubelet puts staging
// paths at plugins/kubernetes.io/csi/<driver>/<hash>/globalmount (2 levels
// below the root the driver is given) and block staging paths at
// volumeDevices/staging/<pv> (3 levels); anything deeper is not kubelet's.
const maxStageRecordDepth = 4

// FindStageRecords returns the stage records below root, sorted by staging
// path. It never descends into a mount point: a staging mount holds the
// volume's data (the record is beside it), and a dead mount cannot be read.
// A missing root is no records; an unreadable record is skipped, as
// ReadStageRecord treats it.
func FindStageRecords(root string, mounts []Mount) ([]FoundStageRecord, error) {
	root = filepath.Clean(root)
	mountPoints := make(map[string]bool, len(mounts))
	for _, m := range mounts {
		mountPoints[m.MountPoint] = true
	}
	resolvedRoot := Resolve(root)
	var out []FoundStageRecord
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == root && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			if d != nil && d.IsDir() && path != root {
				return fs.SkipDir // a dead mount or an unreadable directory
			}
			if path == root {
				return err
			}
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		depth := 0
		if rel != "." {
			depth = strings.Count(rel, string(filepath.Separator)) + 1
		}
		if d.IsDir() {
			if path != root && mountPoints[filepath.Join(resolvedRoot, rel)] {
				return fs.SkipDir
			}
			if depth >= maxStageRecordDepth {
				return fs.SkipDir
			}
			return nil
		}
		staging, ok := strings.CutSuffix(path, stageRecordSuffix)
		if !ok || !d.Type().IsRegular() {
			return nil
		}
		rec, err := ReadStageRecord(staging)
		if err != nil {
			return nil
		}
		out = append(out, FoundStageRecord{StagingPath: staging, Record: *rec})
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StagingPath < out[j].StagingPath })
	return out, nil
}

// Mount states of a filesystem volume's staging path, as the node's
// inventory reports them.
const (
	MountStateMounted     = "mounted"      // the volume's device is mounted there
	MountStateMissing     = "missing"      // nothing is mounted there (or the path is gone)
	MountStateDead        = "dead"         // a corrupted mount: ENOTCONN, ESTALE, EIO
	MountStateWrongDevice = "wrong-device" // a mount of some other device
)

// stagingMountState says what is mounted at a filesystem volume's staging
// path, given the device its stage record names.
func (v *Volumes) stagingMountState(staging, device string) string {
	info, err := v.host.Stat(staging)
	switch {
	case err != nil || !info.Exists:
		return MountStateMissing
	case info.Dead:
		return MountStateDead
	case !info.MountRoot:
		return MountStateMissing
	}
	if dev, err := v.host.Stat(device); err == nil && dev.IsBlockDevice() {
		if info.Source == dev.Rdev {
			return MountStateMounted
		}
		return MountStateWrongDevice
	}
	if v.host.DevicePath(info.Source) == device {
		return MountStateMounted
	}
	return MountStateWrongDevice
}

// publishesOf lists the mount points, other than the staging path, where
// the filesystem mounted at staging is also mounted: the pods' binds. For a
// block volume (no staging mount) it lists the binds of the device node.
func (v *Volumes) publishesOf(mounts []Mount, staging, device string) []string {
	resolved := Resolve(staging)
	var out []string
	if top := topMountAt(mounts, resolved); top != nil {
		for _, m := range mounts {
			if m.MountPoint != resolved && m.Major == top.Major && m.Minor == top.Minor {
				out = append(out, m.MountPoint)
			}
		}
		return out
	}
	if device == "" {
		return nil
	}
	return v.deviceBinds(mounts, device)
}

// Staged is the node's inventory of its stages (the /volumes document):
// each stage record below Options.StageRecordsRoot checked against the
// mount table and, through resolve, the volume's backend. It reads the
// whole mount table, once: it is for operators, not for requests.
func (v *Volumes) Staged(ctx context.Context, resolve func(volumeID string) (Volume, error)) ([]opsapi.StagedVolume, []string) {
	out := []opsapi.StagedVolume{}
	if v.opts.StageRecordsRoot == "" {
		return out, nil
	}
	mounts, err := v.host.Mounts()
	if err != nil {
		return out, []string{err.Error()}
	}
	recs, err := v.host.StageRecords(v.opts.StageRecordsRoot, mounts)
	var errs []string
	if err != nil {
		errs = append(errs, err.Error())
	}
	for _, r := range recs {
		out = append(out, v.stagedVolume(ctx, r, mounts, resolve))
	}
	return out, errs
}

func (v *Volumes) stagedVolume(ctx context.Context, r FoundStageRecord, mounts []Mount, resolve func(string) (Volume, error)) opsapi.StagedVolume {
	rec := r.Record
	sv := opsapi.StagedVolume{
		VolumeID: rec.VolumeID, Device: rec.Device, StagingPath: r.StagingPath,
		AccessType: rec.AccessType, FsType: rec.FsType, ReadOnly: rec.ReadOnly, StagedAt: rec.StagedAt,
		DeviceState: opsapi.DeviceStateUnknown,
	}
	top := rec.TopDevice()
	if rec.CryptName != "" {
		sv.Encrypted, sv.CryptMapping, sv.MapperDevice = true, MapperPath(rec.CryptName), rec.Mapper
		if m, err := v.host.CryptMappingByName(rec.CryptName); err != nil || !m.Found() || m.Backing != rec.Device {
			sv.Problem = joinProblem(sv.Problem, fmt.Sprintf("dm-crypt mapping %s is not open on %s", rec.CryptName, rec.Device))
		}
	}
	if rec.AccessType != string(backend.AccessBlock) {
		sv.MountState = v.stagingMountState(r.StagingPath, top)
		switch sv.MountState {
		case MountStateMissing:
			sv.Problem = joinProblem(sv.Problem, fmt.Sprintf("nothing is mounted at the staging path; the volume's filesystem on %s is not staged", top))
		case MountStateDead:
			sv.Problem = joinProblem(sv.Problem, "the staging mount is dead (ENOTCONN, ESTALE or EIO)")
		case MountStateWrongDevice:
			sv.Problem = joinProblem(sv.Problem, fmt.Sprintf("the staging path holds a mount of another device than %s", top))
		}
	}
	sv.Publishes = v.publishesOf(mounts, r.StagingPath, top)
	id, err := volumeid.Parse(rec.VolumeID)
	if err != nil {
		sv.Problem = joinProblem(sv.Problem, err.Error())
		return sv
	}
	sv.Backend, sv.Image = id.InstanceKey(), id.Image
	vol, err := resolve(rec.VolumeID)
	if err != nil {
		sv.Problem = joinProblem(sv.Problem, err.Error())
		return sv
	}
	_, err = vol.Attacher.Identify(ctx, vol.Image, rec.Device)
	switch {
	case err == nil:
		sv.DeviceState = opsapi.DeviceStateAttached
	case errdefs.KindOf(err) == errdefs.ErrNotFound:
		sv.DeviceState = opsapi.DeviceStateMissing
		sv.Problem = joinProblem(sv.Problem, err.Error())
	default:
		sv.Problem = joinProblem(sv.Problem, err.Error())
	}
	return sv
}

func joinProblem(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// StagedVolumeIDs lists the volume IDs of the stage records below
// Options.StageRecordsRoot (for the staged-volumes gauge).
func (v *Volumes) StagedVolumeIDs() ([]string, error) {
	if v.opts.StageRecordsRoot == "" {
		return nil, nil
	}
	mounts, err := v.host.Mounts()
	if err != nil {
		return nil, err
	}
	recs, err := v.host.StageRecords(v.opts.StageRecordsRoot, mounts)
	ids := make([]string, 0, len(recs))
	for _, r := range recs {
		ids = append(ids, r.Record.VolumeID)
	}
	return ids, err
}
