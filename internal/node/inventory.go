package node

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
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

// StagingMountState says what is mounted at a filesystem volume's staging
// path, given the device its stage record names.
func StagingMountState(mounts []Mount, staging, device string) string {
	top := topMountAt(mounts, Resolve(staging))
	if top == nil {
		return MountStateMissing
	}
	if corrupted, _ := CheckHealthy(staging); corrupted {
		return MountStateDead
	}
	major, minor, err := DeviceNumber(device)
	if err != nil {
		if top.Source == device {
			return MountStateMounted
		}
		return MountStateWrongDevice
	}
	if top.IsMountOf(device, major, minor) {
		return MountStateMounted
	}
	return MountStateWrongDevice
}

// PublishesOf lists the mount points, other than the staging path, where
// the filesystem mounted at staging is also mounted: the pods' binds. For a
// block volume (no staging mount) it lists the binds of the device node.
func PublishesOf(mounts []Mount, staging, device string) []string {
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
	for _, m := range mounts {
		if m.Root == "/"+filepath.Base(device) && (m.FsType == "devtmpfs" || m.FsType == "tmpfs") {
			out = append(out, m.MountPoint)
		}
	}
	return out
}
