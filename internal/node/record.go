package node

import (
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"github.com/spindle-csi/spindle/internal/atomicfile"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// StageRecord is written beside the staging path when a volume is staged. It
// says which device was staged for the volume, which is how a block publish
// finds it and how operators see what a staging path holds. It describes
// state a power loss wipes out (mounts, attached devices), so it is written
// atomically but not synced, and an unreadable record counts as a missing
// one; NodeUnstageVolume itself never needs it, since it finds the volume's
// devices and mounts from the kernel.
type StageRecord struct {
	Version    int       `json:"version"`
	VolumeID   string    `json:"volumeID"`
	Device     string    `json:"device"`
	AccessType string    `json:"accessType"` // mount or block
	FsType     string    `json:"fsType,omitempty"`
	ReadOnly   bool      `json:"readOnly"`
	StagedAt   time.Time `json:"stagedAt"`
	// BootID is the node's boot (Boot.ID) the record was written in: a
	// record from an earlier boot describes mounts and devices that are
	// gone (ForgetEarlierBoots).
	BootID string `json:"bootID,omitempty"`
}

const (
	stageRecordVersion = 1
	stageRecordSuffix  = ".spindle-stage.json"
)

// StageRecordPath is where the record of a staging path lives: next to it,
// not inside it, so the mount does not hide it. Kubelet's block staging
// directories share one parent, so the name carries the staging path's own.
func StageRecordPath(stagingPath string) string {
	clean := filepath.Clean(stagingPath)
	return filepath.Join(filepath.Dir(clean), filepath.Base(clean)+stageRecordSuffix)
}

// WriteStageRecord stores rec for stagingPath, atomically.
func WriteStageRecord(stagingPath string, rec StageRecord) error {
	rec.Version = stageRecordVersion
	if rec.StagedAt.IsZero() {
		rec.StagedAt = time.Now().UTC().Truncate(time.Second)
	}
	if rec.BootID == "" {
		// Without the boot ID, StagedAt still tells an earlier boot's record.
		boot, _ := currentBoot()
		rec.BootID = boot.ID
	}
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	path := StageRecordPath(stagingPath)
	if err := checkReplaceableRecord(path); err != nil {
		return err
	}
	return atomicfile.WriteVolatile(path, append(data, '\n'), 0o600)
}

// checkReplaceableRecord refuses to replace what is at a stage record's
// path unless it is a record (or the empty or torn file a power loss can
// leave of one): a file of that name that the driver did not write is
// somebody's data.
func checkReplaceableRecord(path string) error {
	st, err := os.Lstat(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return errdefs.Precondition("%s is in the way of the stage record (%s); the node plugin leaves it as it is", path, st.Mode().Type())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rec StageRecord
	if len(data) > 0 && (json.Unmarshal(data, &rec) != nil || rec.Version == 0 || rec.VolumeID == "") {
		return errdefs.Precondition("%s is in the way of the stage record and is not one; the node plugin leaves it as it is", path)
	}
	return nil
}

// ReadStageRecord returns the record of stagingPath, or ErrNotFound.
func ReadStageRecord(stagingPath string) (*StageRecord, error) {
	path := StageRecordPath(stagingPath)
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, errdefs.NotFound("no stage record at %s", path)
	}
	if err != nil {
		return nil, err
	}
	var rec StageRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrNotFound, err, "stage record %s is unreadable (written when the node lost power?)", path)
	}
	return &rec, nil
}

// RemoveStageRecord deletes the record of stagingPath; a missing one is
// fine. Only a regular file is removed: anything else by that name is not
// a record the driver wrote.
func RemoveStageRecord(stagingPath string) error {
	path := StageRecordPath(stagingPath)
	st, err := os.Lstat(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return errdefs.Precondition("%s is not a stage record (%s); the node plugin leaves it as it is", path, st.Mode().Type())
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}
