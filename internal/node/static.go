package node

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// StaticVolume is what the node keeps of a pre-provisioned volume while it
// is staged (internal/driver's static.go): the image its handle names and
// the backend instance that serves it. NodeStage and NodePublish carry the
// volume context that names the image; NodeUnstage, NodeUnpublish, the
// stats, the health check and NodeExpandVolume carry only the handle, and
// find the image in this record.
type StaticVolume struct {
	Handle  string `json:"handle"`
	Backend string `json:"backend"` // the instance key, "rbd/ceph-a"
	Image   string `json:"image"`   // the image ID
}

// staticRecordPath is where the record of handle lives: a file named by a
// hash of the handle (any string a PersistentVolume may hold) in
// Options.StaticRecordsDir. Node plugins have written this layout and this
// JSON since they served pre-provisioned volumes; a plugin upgraded under
// staged ones reads them as they are, so neither may change.
func (v *Volumes) staticRecordPath(handle string) (string, error) {
	if v.opts.StaticRecordsDir == "" {
		return "", errdefs.Precondition("the node plugin has no directory for its records of pre-provisioned volumes (its --endpoint names no socket directory)")
	}
	sum := sha256.Sum256([]byte(handle))
	return filepath.Join(v.opts.StaticRecordsDir, hex.EncodeToString(sum[:16])+".json"), nil
}

// RecordStatic records a pre-provisioned volume before it is staged, so
// that whatever the stage leaves, the unstage that follows finds the image.
// The record is synced: a node that lost power still unstages the volume
// when kubelet asks after the reboot.
func (v *Volumes) RecordStatic(sv StaticVolume) error {
	path, err := v.staticRecordPath(sv.Handle)
	if err != nil {
		return err
	}
	data, err := json.Marshal(sv)
	if err != nil {
		return err
	}
	return v.host.WriteRecord(path, data)
}

// StaticVolume returns the record of handle, nil when there is none. A
// file there that is not a record of handle counts as none.
func (v *Volumes) StaticVolume(handle string) (*StaticVolume, error) {
	path, err := v.staticRecordPath(handle)
	if err != nil {
		return nil, err
	}
	data, err := v.host.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var sv StaticVolume
	if err := json.Unmarshal(data, &sv); err != nil || sv.Handle != handle {
		return nil, nil
	}
	return &sv, nil
}

// ForgetStatic removes the record of handle once the volume is unstaged;
// no record is fine.
func (v *Volumes) ForgetStatic(handle string) error {
	path, err := v.staticRecordPath(handle)
	if err != nil {
		return err
	}
	if err := v.host.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}
