// Package backend defines the contracts every Spindle backend implements.
//
// A backend is split into three roles so that an image store and a transport
// can be combined (the iSCSI backend exports file images like the loop
// backend's; RBD has its own store):
//
//   - ImageStore (controller side): create, delete and describe images and
//     keep their metadata (CSI name, size, fs type, "formatted", attachments).
//   - Exporter (controller side): grant and revoke a node's access
//     (ControllerPublish/Unpublish) and enforce access modes.
//   - Attacher (node side): turn a publish_context into a local block device
//     and back, proving the device is the right image before anything uses it.
//
// Errors are built on internal/errdefs kinds; internal/driver maps them to
// gRPC codes. The conformance suite in internal/backend/conformance checks that
// a backend keeps these contracts.
package backend

import (
	"context"
	"maps"
	"slices"
	"time"
)

// AccessType is how a volume is consumed: through a filesystem or as a raw device.
type AccessType string

const (
	AccessMount AccessType = "mount"
	AccessBlock AccessType = "block"
)

// AccessMode mirrors the CSI access modes; the values are the CSI enum names,
// so they read the same in metadata, logs and VolumeAttachment objects.
type AccessMode string

const (
	SingleNodeWriter       AccessMode = "SINGLE_NODE_WRITER"
	SingleNodeReaderOnly   AccessMode = "SINGLE_NODE_READER_ONLY"
	SingleNodeSingleWriter AccessMode = "SINGLE_NODE_SINGLE_WRITER"
	SingleNodeMultiWriter  AccessMode = "SINGLE_NODE_MULTI_WRITER"
	MultiNodeReaderOnly    AccessMode = "MULTI_NODE_READER_ONLY"
	MultiNodeSingleWriter  AccessMode = "MULTI_NODE_SINGLE_WRITER"
	MultiNodeMultiWriter   AccessMode = "MULTI_NODE_MULTI_WRITER"
)

// SingleNode reports whether the mode allows only one node at a time.
func (m AccessMode) SingleNode() bool {
	switch m {
	case SingleNodeWriter, SingleNodeReaderOnly, SingleNodeSingleWriter, SingleNodeMultiWriter:
		return true
	}
	return false
}

// ReadOnly reports whether the mode forbids writes.
func (m AccessMode) ReadOnly() bool {
	return m == SingleNodeReaderOnly || m == MultiNodeReaderOnly
}

// VolumeSpec is what CreateVolume asks an image store for.
type VolumeSpec struct {
	Name string // the CSI name; creation is idempotent by name
	// CapacityBytes is the size to allocate, already rounded by the driver.
	CapacityBytes int64
	// RequiredBytes and LimitBytes are the caller's range (0 = unset); a
	// repeated CreateVolume is compatible when the existing size fits them.
	RequiredBytes int64
	LimitBytes    int64
	AccessType    AccessType
	FsType        string // empty for block volumes
	// Parameters are the StorageClass parameters that shape the volume
	// (mkfsOptions, ...). Two requests with different parameters are different volumes.
	Parameters map[string]string
	// MutableParameters are the VolumeAttributesClass parameters the volume
	// starts with (see ImageStore.Modify).
	MutableParameters map[string]string
	// Source, when set, makes the image a copy of a snapshot or of another
	// volume's image (a clone). The copy keeps the source's filesystem and
	// "formatted" flag, so it is never formatted again; CapacityBytes may be
	// larger than the source (the image is grown), never smaller.
	Source *ContentSource
	// Encryption, when set, is kept with the image (Image.Encryption).
	Encryption *Encryption
}

// Encryption is what an encrypted volume or snapshot keeps of its key: the
// KMS that wrapped its passphrase, whose passphrase it is to that KMS, and
// the wrapped passphrase. Never the passphrase itself. The store keeps it
// as it is given; the driver makes and reads it (internal/kms).
type Encryption struct {
	KMSID      string `json:"kmsID"`
	KeyOwner   string `json:"keyOwner"`
	WrappedKey string `json:"wrappedKey"`
	// NextWrappedKey is the passphrase a key rotation under way adds to the
	// LUKS header before it removes WrappedKey's; a stage that finds the
	// old key gone opens with it.
	NextWrappedKey string `json:"nextWrappedKey,omitempty"`
	// PreviousWrappedKey is the passphrase the last rotation replaced,
	// kept until the next one: a stage whose header still has it (a
	// rotation recorded before the node finished) opens with it.
	PreviousWrappedKey string `json:"previousWrappedKey,omitempty"`
}

// EncryptionKeeper is implemented by stores that can change an image's
// Encryption in place (key rotation).
type EncryptionKeeper interface {
	SetEncryption(ctx context.Context, imageID string, e *Encryption) error
}

// Clone returns a copy (nil stays nil).
func (e *Encryption) Clone() *Encryption {
	if e == nil {
		return nil
	}
	c := *e
	return &c
}

// ContentSource names what a new image is copied from: exactly one is set.
type ContentSource struct {
	SnapshotID string // a snapshot of this store
	ImageID    string // a volume image of this store
}

// Image is an image store's record of one volume.
type Image struct {
	ID            string            `json:"id"`   // the image part of the volume ID
	Name          string            `json:"name"` // the CSI name
	CapacityBytes int64             `json:"capacityBytes"`
	AccessType    AccessType        `json:"accessType"`
	FsType        string            `json:"fsType,omitempty"`
	Formatted     bool              `json:"formatted"`
	Parameters    map[string]string `json:"parameters,omitempty"`
	// MutableParameters are the volume's current VolumeAttributesClass
	// parameters (ControllerModifyVolume).
	MutableParameters map[string]string `json:"mutableParameters,omitempty"`
	// Source is what the image was copied from, if anything; a repeated
	// CreateVolume must name the same source.
	Source      *ContentSource `json:"source,omitempty"`
	Attachments []Attachment   `json:"attachments,omitempty"`
	CreatedAt   time.Time      `json:"createdAt"`
	// Encryption: the image's data is a LUKS2 volume whose passphrase
	// this wraps; nil for an unencrypted image.
	Encryption *Encryption `json:"encryption,omitempty"`
}

// Clone returns a deep copy.
func (img *Image) Clone() *Image {
	c := *img
	c.Parameters = maps.Clone(img.Parameters)
	c.MutableParameters = maps.Clone(img.MutableParameters)
	if img.Source != nil {
		src := *img.Source
		c.Source = &src
	}
	c.Attachments = slices.Clone(img.Attachments)
	c.Encryption = img.Encryption.Clone()
	return &c
}

// Snapshot is a point-in-time copy of a volume's image.
type Snapshot struct {
	ID            string    `json:"id"`   // the image part of the snapshot ID
	Name          string    `json:"name"` // the CSI name; creation is idempotent by name
	SourceImageID string    `json:"sourceImageID"`
	SizeBytes     int64     `json:"sizeBytes"` // the source's size when taken
	CreatedAt     time.Time `json:"createdAt"`
	ReadyToUse    bool      `json:"readyToUse"`
	// What a volume restored from the snapshot inherits.
	AccessType AccessType `json:"accessType"`
	FsType     string     `json:"fsType,omitempty"`
	Formatted  bool       `json:"formatted"`
	// Encryption: the snapshot of an encrypted volume keeps its
	// passphrase wrapped for itself, so it outlives the volume's key.
	Encryption *Encryption `json:"encryption,omitempty"`
}

// SnapshotSpec is what CreateSnapshot asks for.
type SnapshotSpec struct {
	Name          string
	SourceImageID string
	Parameters    map[string]string
	// Encryption, when set, is kept with the snapshot.
	Encryption *Encryption
}

// Capacity is what an image store can still allocate.
type Capacity struct {
	// AvailableBytes is the total size of new images that fit now.
	AvailableBytes int64
	// MaximumVolumeBytes is the largest single image that fits now (the
	// same as AvailableBytes for a pool of sparse files).
	MaximumVolumeBytes int64
}

// Attachment records that a node was granted access by ControllerPublish.
type Attachment struct {
	NodeID     string     `json:"nodeID"`
	AccessMode AccessMode `json:"accessMode"`
	ReadOnly   bool       `json:"readOnly"`
	Since      time.Time  `json:"since"`
}

// NodeInfo is what a node plugin tells a backend about itself, so the
// controller can refuse to publish to a node that cannot reach the backend.
type NodeInfo struct {
	NodeID            string    `json:"nodeID"`
	MaxVolumesPerNode int64     `json:"maxVolumesPerNode,omitempty"`
	RegisteredAt      time.Time `json:"registeredAt"`
}

// ImageStore allocates images and keeps their metadata.
type ImageStore interface {
	// Create allocates an image for spec, or returns the existing one when an
	// image with spec.Name exists and is compatible (ErrAlreadyExists when not).
	// A failed Create leaves nothing behind.
	Create(ctx context.Context, spec VolumeSpec) (*Image, error)
	// Delete removes the image. A missing image is success; an image that is
	// still published is ErrPrecondition.
	Delete(ctx context.Context, imageID string) error
	// Get returns the image or ErrNotFound.
	Get(ctx context.Context, imageID string) (*Image, error)
	// List returns every image, sorted by ID.
	List(ctx context.Context) ([]*Image, error)
	// Expand grows the image to newBytes (already rounded by the driver)
	// and returns it. The same size is a no-op; a smaller one ErrOutOfRange;
	// one that does not fit ErrExhausted.
	Expand(ctx context.Context, imageID string, newBytes int64) (*Image, error)
	// Modify merges mutable parameters into the image's and returns it;
	// they take effect at the next attach. The keys and values a backend
	// understands are its own: anything else is ErrInvalidArgument naming
	// the key, and Create checks spec.MutableParameters the same way.
	Modify(ctx context.Context, imageID string, mutable map[string]string) (*Image, error)
	// Capacity reports what the store can still allocate.
	Capacity(ctx context.Context) (Capacity, error)
	// Probe reports whether the store is reachable and usable.
	Probe(ctx context.Context) error
}

// Snapshotter is implemented by image stores that take snapshots.
type Snapshotter interface {
	// CreateSnapshot copies the source image as it is at one instant, or
	// returns the existing snapshot of that name when it has the same
	// source (ErrAlreadyExists when not). A store that cannot take a
	// point-in-time copy of an image in use refuses with ErrPrecondition,
	// saying why. A failed CreateSnapshot leaves nothing behind.
	CreateSnapshot(ctx context.Context, spec SnapshotSpec) (*Snapshot, error)
	// DeleteSnapshot removes it; a missing snapshot is success.
	DeleteSnapshot(ctx context.Context, snapshotID string) error
	// GetSnapshot returns it or ErrNotFound.
	GetSnapshot(ctx context.Context, snapshotID string) (*Snapshot, error)
	// ListSnapshots returns every snapshot, sorted by ID.
	ListSnapshots(ctx context.Context) ([]*Snapshot, error)
}

// Exporter grants and revokes nodes' access to images.
type Exporter interface {
	// SupportsAccess returns ErrInvalidArgument, naming the reason, when the
	// backend cannot serve the access type and mode combination.
	SupportsAccess(t AccessType, m AccessMode) error
	// Publish grants att.NodeID access and returns the publish_context the
	// node needs. Repeating a compatible publish is a no-op; a second node on a
	// single-node volume is ErrPrecondition naming the holder; the same node
	// with other flags is ErrAlreadyExists; an unknown image or node
	// ErrNotFound; a node that already has as many volumes published as its
	// registered MaxVolumesPerNode ErrExhausted.
	Publish(ctx context.Context, imageID string, att Attachment) (map[string]string, error)
	// Unpublish revokes a node's access. Unknown nodes and images are success.
	Unpublish(ctx context.Context, imageID, nodeID string) error
}

// Reconciler is implemented by image stores whose state (or whose
// exports') can be left inconsistent by a crash or a restart elsewhere: the
// iSCSI store re-applies the targets tgtd forgot when it restarted; the RBD
// store removes the temporary images of interrupted creates. A controller
// calls Reconcile when it opens the instance; it returns what it changed,
// for the log.
type Reconciler interface {
	Reconcile(ctx context.Context) (changed []string, err error)
}

// ContextReadOnly is the publish_context key, common to all backends, that
// tells the node the controller granted read-only access.
const ContextReadOnly = "readOnly"

// publish_context keys, common to all backends, of an encrypted volume
// (Encryption): its wrapped passphrase and what unwraps it. Wrapped, they
// reveal nothing without the KMS (and, for the secrets KMS, the Kubernetes
// Secret); they show in VolumeAttachment.status.
const (
	ContextEncryptionKMSID   = "encryptionKMSID"
	ContextEncryptionOwner   = "encryptionKeyOwner"
	ContextEncryptionWrapped = "encryptionWrappedKey"
	// During and after a key rotation: the key it adds, and the key the
	// last one replaced.
	ContextEncryptionNext     = "encryptionNextWrappedKey"
	ContextEncryptionPrevious = "encryptionPreviousWrappedKey"
)

// AttachRequest asks a node's attacher for a local device.
type AttachRequest struct {
	ImageID        string
	NodeID         string
	PublishContext map[string]string
	ReadOnly       bool
}

// Device is an attached image on this node.
type Device struct {
	Path     string // /dev/loop3, /dev/nbd0, ...
	ReadOnly bool
	// Formatted and FsType are the image store's record, as the node reads
	// it (from the store, or from the publish_context the controller built
	// from it); a formatted image is never formatted again, nor is a copy.
	Formatted bool
	FsType    string
	// AccessType is what the image was created for, when the node knows
	// it: a block volume's raw data must never be formatted over.
	AccessType AccessType
}

// DeviceOf describes the device at path attached for img.
func DeviceOf(img *Image, path string, readOnly bool) *Device {
	return &Device{Path: path, ReadOnly: readOnly, Formatted: img.Formatted, FsType: img.FsType, AccessType: img.AccessType}
}

// Attacher is the node side of a backend.
type Attacher interface {
	// Attach returns a local device for the image, reusing one that is
	// already attached with the same read-only setting, after proving it is
	// that image. ErrPrecondition when the image is not published to this node.
	Attach(ctx context.Context, req AttachRequest) (*Device, error)
	// Detach releases devicePath, or every device of the image when
	// devicePath is empty. It never releases a device that is not proven to be
	// the image's, and refuses (ErrPrecondition) one that is still in use.
	// Nothing attached is success.
	Detach(ctx context.Context, imageID, devicePath string) error
	// Devices lists the devices currently attached for the image on this node.
	Devices(ctx context.Context, imageID string) ([]Device, error)
	// Identify proves that devicePath is attached for the image and returns
	// it, or ErrNotFound when it is not (another image's device, no device
	// at all). Unlike Devices it looks at that one device only, so the node
	// can check a mount's device on every RPC without scanning all of them.
	Identify(ctx context.Context, imageID, devicePath string) (*Device, error)
	// Refresh makes an attached device see its image's current size (after
	// Expand) and returns the device's size in bytes.
	Refresh(ctx context.Context, imageID, devicePath string) (int64, error)
	// RecordFormatted notes that the image now holds fsType, where the
	// backend keeps that fact: in the image's metadata, or, for a backend
	// whose node reads no store, nowhere but in the filesystem itself (the
	// iSCSI controller reads it from the image at the volume's next
	// publish).
	RecordFormatted(ctx context.Context, imageID, fsType string) error
	// RegisterNode announces this node to the backend (idempotent).
	RegisterNode(ctx context.Context, info NodeInfo) error
	// Probe reports whether this node can attach images of this backend.
	Probe(ctx context.Context) error
}

// DeviceLister is implemented by attachers that can list every device they
// hold on this node, whatever staged it: the node's inventory (the
// /volumes endpoint, the attached-volumes gauge) and the operators' check
// for devices that no VolumeAttachment explains rely on it.
type DeviceLister interface {
	AttachedDevices(ctx context.Context) ([]AttachedDevice, error)
}

// ImageChecker is implemented by attachers (and stores) that can tell
// whether an image's data is still there, for the volume-health RPCs: the
// file-image backends check that the image file exists. ErrNotFound means
// the data is gone.
type ImageChecker interface {
	CheckImage(ctx context.Context, imageID string) error
}

// AttachedDevice is one device an attacher holds on this node.
type AttachedDevice struct {
	ImageID string
	Device
	// ImageDeleted: the device is bound to an image that no longer exists
	// (a loop device on an unlinked file).
	ImageDeleted bool
}

// Instance is one configured backend instance, e.g. "loop/default".
type Instance struct {
	Type     string // "loop", "iscsi", "rbd"
	Name     string // from the config, e.g. "default"
	Store    ImageStore
	Exporter Exporter
	Attacher Attacher
	// Snapshots is nil when the store takes no snapshots.
	Snapshots Snapshotter
	// GroupSnapshots is nil when the store cannot snapshot several volumes
	// at one instant.
	GroupSnapshots GroupSnapshotter
	// NodeLocal: the instance's images live on the node that runs this
	// process and are reachable from it only (a pool directory on a local
	// disk). The driver then reports topology and serves only this node.
	NodeLocal bool
}

// Key is "<type>/<name>", the prefix of every volume ID the instance serves.
func (i *Instance) Key() string { return i.Type + "/" + i.Name }
