package backend

import (
	"context"
	"strings"
)

// Parameters is implemented by image stores that take StorageClass and
// VolumeSnapshotClass parameters of their own (the rbd store takes
// ceph-csi's). The driver keeps its own keys (backend, mkfsOptions,
// csi.storage.k8s.io/*) and hands the store the rest; they are kept with
// the volume (VolumeSpec.Parameters) and returned as its volume context.
type Parameters interface {
	// Claims reports whether parameters that name no backend instance are
	// meant for this one: the rbd store claims the cluster IDs of its
	// config and of its cluster map.
	Claims(params map[string]string) bool
	// CheckVolumeParameters validates the store's keys of a CreateVolume
	// without creating anything: ErrInvalidArgument names the key it does
	// not take, or whose value it refuses, and why.
	CheckVolumeParameters(params map[string]string) error
	// CheckSnapshotParameters does the same for a CreateSnapshot of the
	// image sourceImageID.
	CheckSnapshotParameters(sourceImageID string, params map[string]string) error
}

// StaticVolumes is implemented by image stores that serve pre-provisioned
// volumes: a PersistentVolume that names an image made outside Spindle
// by its volumeHandle and volumeAttributes (ceph-csi's static form). Such
// a volume has no records of Spindle's: the controller grants nodes
// nothing (ControllerPublish only hands over where the image is), nodes
// attach it with StaticAttacher, and Spindle never deletes it.
type StaticVolumes interface {
	// StaticImage returns the image ID that a static volume's handle and
	// attributes name, or ErrInvalidArgument saying what is missing.
	StaticImage(handle string, attrs map[string]string) (imageID string, err error)
	// StaticPublishContext is what a node needs to attach the image.
	StaticPublishContext(imageID string, attrs map[string]string) (map[string]string, error)
	// StaticAttacher attaches static images: no grant is looked for, and
	// nothing is recorded in the image.
	StaticAttacher() Attacher
}

// StaticVolumeAttribute is the volumeAttributes key that marks a
// pre-provisioned volume, as ceph-csi spells it ("true").
const StaticVolumeAttribute = "staticVolume"

// Adopter is implemented by image stores that can take over an image made
// by another driver in place (ceph-csi's, kubectl spindle adopt): the image
// gains the records of a volume of this store and no data moves.
type Adopter interface {
	// Adopt makes spec.ImageID a volume named spec.Name. An image that
	// already is another volume, or that the volume's mounter cannot map,
	// is ErrPrecondition; adopting it again under the same name returns
	// it. An image in use (open on a node) is ErrPrecondition too, but for
	// a dry run: the dry run comes before whatever uses the image is
	// stopped, so it answers who has the image open (Adopted.OpenBy)
	// instead. With DryRun nothing is written and the volume is returned
	// as it would be.
	Adopt(ctx context.Context, spec AdoptSpec) (*Adopted, error)
}

// Adopted is the volume an image became (or, in a dry run, would become).
type Adopted struct {
	Image *Image
	// OpenBy names the clients that have the image open (a dry run only;
	// a real adoption of an open image is refused).
	OpenBy []string
}

// AdoptSpec is what Adopt is asked for.
type AdoptSpec struct {
	// ImageID names the image as StaticImage does.
	ImageID string
	// Name is the CSI name the volume gets (its new PersistentVolume's).
	Name       string
	AccessType AccessType
	FsType     string
	// Parameters are the StorageClass parameters the volume is recorded
	// with, as CreateVolume records them.
	Parameters map[string]string
	DryRun     bool
}

// Keys of the parameters the driver itself takes, whatever the backend. A
// volume's recorded parameters (VolumeSpec.Parameters) hold them beside
// the backend's; a store reading those skips them.
const (
	ParamBackend     = "backend"     // "<type>/<instance>"; the default instance when absent
	ParamMkfsOptions = "mkfsOptions" // extra mkfs arguments, whitespace-separated
	// ParamEncrypted and ParamEncryptionKMSID are ceph-csi's names, with
	// its meaning, for every backend: the driver encrypts (LUKS2 on the
	// node) and hands a store only the wrapped key (VolumeSpec.Encryption).
	ParamEncrypted       = "encrypted"       // "true": the volume's data is a LUKS2 volume
	ParamEncryptionKMSID = "encryptionKMSID" // the KMS that wraps its passphrase
	// ProvisionerPrefix starts the keys the sidecars add or read
	// (csi.storage.k8s.io/fstype, the secrets' names, the PVC's name with
	// --extra-create-metadata).
	ProvisionerPrefix = "csi.storage.k8s.io/"
)

// DriverParameter reports whether k is the driver's own key.
func DriverParameter(k string) bool {
	switch k {
	case ParamBackend, ParamMkfsOptions, ParamEncrypted, ParamEncryptionKMSID:
		return true
	}
	return strings.HasPrefix(k, ProvisionerPrefix)
}
