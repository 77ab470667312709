// Package opsapi is the JSON that the driver serves on its metrics address
// for operators and kubectl-spindle: what a node plugin holds (/volumes)
// and what a controller's backends store (/images). Both sides import these
// types, so the format has one definition; fields are only ever added.
//
// Endpoints on --metrics-address:
//
//	GET /metrics   Prometheus metrics (internal/metrics)
//	GET /healthz   200 "ok", or 503 with the reason a backend's probe failed
//	GET /volumes   NodeVolumes (node plugins only; 404 on a controller)
//	GET /images    Images (controllers only; 404 on a node plugin)
//	POST /encryption/rotate-key  controllers: RotateKeyRequest -> KeyRotation,
//	               the first step of a key rotation (kubectl spindle
//	               rotate-key): the next passphrase made, wrapped, recorded
//	POST /encryption/rekey       node plugins: KeyRotation -> RotatedKey, the
//	               LUKS header of the volume staged there rekeyed
//	POST /encryption/commit-key  controllers: CommitKeyRequest -> {}, the
//	               next key becomes the volume's
//
// Errors of the POST endpoints are {"error": "..."} with an HTTP status
// (400, 404, 409 busy, 412 precondition, 503).
package opsapi

import "time"

// Paths served on the metrics address.
const (
	PathMetrics = "/metrics"
	PathHealthz = "/healthz"
	PathVolumes = "/volumes"
	PathImages  = "/images"
	// Key rotation (POST).
	PathRotateKey = "/encryption/rotate-key"
	PathRekey     = "/encryption/rekey"
	PathCommitKey = "/encryption/commit-key"
)

// RotateKeyRequest asks the controller to start (or resume) a key rotation
// of an encrypted volume. Secrets are the KMS's request secrets (the
// StorageClass's provisioner Secret, for the built-in secrets KMS).
type RotateKeyRequest struct {
	VolumeID string            `json:"volumeID"`
	Secrets  map[string]string `json:"secrets,omitempty"`
}

// KeyRotation is a rotation under way: the controller's answer, and what
// the node that stages the volume is sent (with Secrets) to rekey the LUKS
// header. The keys are wrapped; no passphrase travels.
type KeyRotation struct {
	VolumeID       string            `json:"volumeID"`
	KMSID          string            `json:"kmsID"`
	KeyOwner       string            `json:"keyOwner"`
	WrappedKey     string            `json:"wrappedKey"`
	NextWrappedKey string            `json:"nextWrappedKey"`
	Secrets        map[string]string `json:"secrets,omitempty"`
}

// RotatedKey is the node's answer: where the rekeyed volume is staged.
type RotatedKey struct {
	VolumeID    string `json:"volumeID"`
	Node        string `json:"node"`
	StagingPath string `json:"stagingPath"`
}

// CommitKeyRequest makes the next key of a rotation the volume's key, once
// the node has rekeyed its header.
type CommitKeyRequest struct {
	VolumeID       string `json:"volumeID"`
	NextWrappedKey string `json:"nextWrappedKey"`
}

// Error is the body of a failed POST.
type Error struct {
	Error string `json:"error"`
}

// FormatVersion is the version of the documents below.
const FormatVersion = 1

// NodeVolumes is what a node plugin has on its node: the volumes it staged
// (from its stage records, checked against /proc/self/mountinfo and the
// backend) and every device its backends hold, staged or not.
type NodeVolumes struct {
	Version     int       `json:"version"`
	Driver      string    `json:"driver"`
	Node        string    `json:"node"` // the node ID (NodeGetInfo)
	GeneratedAt time.Time `json:"generatedAt"`
	// Staged is one entry per stage record, sorted by staging path.
	Staged []StagedVolume `json:"staged"`
	// Devices is every device the backends hold on the node, sorted by
	// backend and device.
	Devices []AttachedDevice `json:"devices"`
	// Errors are the parts of the inventory that could not be read (a
	// backend that cannot list its devices); the rest is still reported.
	Errors []string `json:"errors,omitempty"`
}

// Mount states of a filesystem volume's staging path.
const (
	MountStateMounted     = "mounted"
	MountStateMissing     = "missing"
	MountStateDead        = "dead"
	MountStateWrongDevice = "wrong-device"
)

// Device states of a staged volume's device.
const (
	DeviceStateAttached = "attached" // the backend proves the device is the volume's
	DeviceStateMissing  = "missing"  // gone, or now some other image's device
	DeviceStateUnknown  = "unknown"  // the backend could not tell (see Problem)
)

// StagedVolume is one volume staged on the node.
type StagedVolume struct {
	VolumeID    string    `json:"volumeID"`
	Backend     string    `json:"backend"` // the backend instance, "loop/default"
	Image       string    `json:"image"`
	Device      string    `json:"device"`
	StagingPath string    `json:"stagingPath"`
	AccessType  string    `json:"accessType"` // mount or block
	FsType      string    `json:"fsType,omitempty"`
	ReadOnly    bool      `json:"readOnly"`
	StagedAt    time.Time `json:"stagedAt"`
	// Encrypted: Device is opened with dm-crypt (LUKS2) as CryptMapping
	// (/dev/mapper/<name>), device node MapperDevice (/dev/dm-N), which
	// holds the filesystem or is what a block publish binds.
	Encrypted    bool   `json:"encrypted,omitempty"`
	CryptMapping string `json:"cryptMapping,omitempty"`
	MapperDevice string `json:"mapperDevice,omitempty"`
	// MountState is mounted, missing, dead or wrong-device for a
	// filesystem volume; empty for a block volume, whose stage mounts nothing.
	MountState string `json:"mountState,omitempty"`
	// DeviceState is attached, missing or unknown.
	DeviceState string `json:"deviceState"`
	// Publishes are the other mount points of the volume: its pods' binds.
	Publishes []string `json:"publishes,omitempty"`
	// Problem explains a state other than mounted/attached, when known.
	Problem string `json:"problem,omitempty"`
}

// AttachedDevice is one device a backend holds on the node.
type AttachedDevice struct {
	Backend  string `json:"backend"`
	Image    string `json:"image"`
	VolumeID string `json:"volumeID"`
	Device   string `json:"device"`
	ReadOnly bool   `json:"readOnly"`
	// ImageDeleted: bound to an image that no longer exists.
	ImageDeleted bool `json:"imageDeleted,omitempty"`
}

// Images is what a controller's backends store.
type Images struct {
	Version     int             `json:"version"`
	Driver      string          `json:"driver"`
	GeneratedAt time.Time       `json:"generatedAt"`
	Backends    []BackendImages `json:"backends"`
}

// BackendImages lists one backend instance's images; Error says why the
// list is missing, and then Images must not be read as "no images".
type BackendImages struct {
	Backend string  `json:"backend"`
	Images  []Image `json:"images"`
	Error   string  `json:"error,omitempty"`
	// Tasks is the instance's background work (flattening copy-on-write
	// clones, removing deleted images), of its volumes and of what is
	// not a volume (snapshot images, trashed images); TasksError says why
	// the list is missing.
	Tasks      []Task `json:"tasks,omitempty"`
	TasksError string `json:"tasksError,omitempty"`
}

// Task is one piece of a backend's background work.
type Task struct {
	Action     string    `json:"action"` // flatten, remove
	Image      string    `json:"image"`  // the backend's image name ("pool/csi-vol-…")
	Progress   float64   `json:"progress"`
	InProgress bool      `json:"inProgress"`
	Runner     string    `json:"runner"` // ceph-mgr, driver
	Message    string    `json:"message,omitempty"`
	Since      time.Time `json:"since,omitzero"`
}

// Image is one image of a backend.
type Image struct {
	VolumeID      string   `json:"volumeID"`
	Image         string   `json:"image"`
	Name          string   `json:"name"` // the CSI name (the PV's name)
	CapacityBytes int64    `json:"capacityBytes"`
	PublishedTo   []string `json:"publishedTo,omitempty"` // node IDs
	// Tasks is the background work on this volume's image.
	Tasks []Task `json:"tasks,omitempty"`
}
