package node

import (
	"encoding/json"
	"os"
	"path/filepath"
	"time"

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
	Version    int    `json:"version"`
	VolumeID   string `json:"volumeID"`
	Device     string `json:"device"`
	AccessType string `json:"accessType"` // mount or block
	FsType     string `json:"fsType,omitempty"`
	// CryptName and Mapper: the volume is encrypted, and Device is opened
	// as dm-crypt mapping CryptName (/dev/mapper/CryptName), whose device
	// node Mapper (/dev/dm-N) holds the filesystem or is what a block
	// publish binds.
	CryptName string    `json:"cryptName,omitempty"`
	Mapper    string    `json:"mapper,omitempty"`
	ReadOnly  bool      `json:"readOnly"`
	StagedAt  time.Time `json:"stagedAt"`
	// BootID is the node's boot (Boot.ID) the record was written in: a
	// record from an earlier boot describes mounts and devices that are
	// gone (ForgetEarlierBoots).
	BootID string `json:"bootID,omitempty"`
	// Publishes are the target paths the volume has been published at
	// while staged here: a publish adds its target before it binds, and
	// drops the targets that no longer hold the volume. Unstage and a
	// single-writer publish check these few paths instead of reading the
	// whole mount table. nil in records of drivers that did not keep
	// them; the mount table is read then.
	Publishes *[]string `json:"publishes,omitempty"`
}

// TopDevice is the device the volume's data is used through: the dm-crypt
// mapping of an encrypted volume, Device otherwise.
func (r *StageRecord) TopDevice() string {
	if r.Mapper != "" {
		return r.Mapper
	}
	return r.Device
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

// realFiles is the host the exported record functions use: the real
// filesystem (the inventory, the operators' tools and tests read records
// that way).
var realFiles Host = NewLinuxHost(nil)

// WriteStageRecord stores rec for stagingPath, atomically.
func WriteStageRecord(stagingPath string, rec StageRecord) error {
	return writeStageRecord(realFiles, stagingPath, rec)
}

// ReadStageRecord returns the record of stagingPath, or ErrNotFound.
func ReadStageRecord(stagingPath string) (*StageRecord, error) {
	return readStageRecord(realFiles, stagingPath)
}

// RemoveStageRecord deletes the record of stagingPath; a missing one is
// fine. Only a regular file is removed: anything else by that name is not
// a record the driver wrote.
func RemoveStageRecord(stagingPath string) error {
	return removeStageRecord(realFiles, stagingPath)
}

func writeStageRecord(h Host, stagingPath string, rec StageRecord) error {
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
	if err := checkReplaceableRecord(h, path); err != nil {
		return err
	}
	return h.WriteFile(path, append(data, '\n'))
}

// checkReplaceableRecord refuses to replace what is at a stage record's
// path unless it is a record (or the empty or torn file a power loss can
// leave of one): a file of that name that the driver did not write is
// somebody's data.
func checkReplaceableRecord(h Host, path string) error {
	st, err := h.Stat(path)
	if err != nil || !st.Exists {
		return err
	}
	if st.Dead || st.Type != 0 {
		return errdefs.Precondition("%s is in the way of the stage record (%s); the node plugin leaves it as it is", path, st)
	}
	data, err := h.ReadFile(path)
	if err != nil {
		return err
	}
	var rec StageRecord
	if len(data) > 0 && (json.Unmarshal(data, &rec) != nil || rec.Version == 0 || rec.VolumeID == "") {
		return errdefs.Precondition("%s is in the way of the stage record and is not one; the node plugin leaves it as it is", path)
	}
	return nil
}

func readStageRecord(h Host, stagingPath string) (*StageRecord, error) {
	path := StageRecordPath(stagingPath)
	data, err := h.ReadFile(path)
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

func removeStageRecord(h Host, stagingPath string) error {
	path := StageRecordPath(stagingPath)
	st, err := h.Stat(path)
	if err != nil || !st.Exists {
		return err
	}
	if st.Dead || st.Type != 0 {
		return errdefs.Precondition("%s is not a stage record (%s); the node plugin leaves it as it is", path, st)
	}
	if err := h.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}
