package opsapi

// Adopting a volume of another driver in place (kubectl spindle adopt):
//
//	POST /volumes/adopt   controllers: AdoptRequest -> AdoptedVolume
//
// A failed request answers {"error": "..."} with an HTTP status: 400 for
// a bad request, 404 for an image that does not exist, 409 while another
// operation holds the volume, 412 for an image in use (a dry run answers
// it, in OpenBy), one already another volume or one the StorageClass's
// mounter cannot map, 503 when the backend cannot be reached.

// PathAdopt is where a controller adopts an image.
const PathAdopt = "/volumes/adopt"

// AdoptRequest asks the controller to make the image of another driver's
// PersistentVolume a Spindle volume, in place.
type AdoptRequest struct {
	// Handle and Attributes are the old PV's spec.csi.volumeHandle and
	// volumeAttributes: they say where the image is (ceph-csi's clusterID,
	// pool, radosNamespace, imageName).
	Handle     string            `json:"handle"`
	Attributes map[string]string `json:"attributes"`
	// Name is the CSI name of the volume (the new PV's name).
	Name string `json:"name"`
	// AccessType is "mount" or "block"; FsType the filesystem on it.
	AccessType string `json:"accessType"`
	FsType     string `json:"fsType,omitempty"`
	// Parameters are the StorageClass parameters of the claim it goes to,
	// recorded with the volume as CreateVolume records them.
	Parameters map[string]string `json:"parameters,omitempty"`
	// Secrets are the credentials the backend reaches the image with (the
	// StorageClass's provisioner secret); required: the endpoint has no
	// authentication of its own and never lends the controller's identity.
	Secrets map[string]string `json:"secrets,omitempty"`
	// DryRun checks everything and writes nothing.
	DryRun bool `json:"dryRun,omitempty"`
}

// AdoptedVolume is the volume the image became (or would become).
type AdoptedVolume struct {
	VolumeID      string            `json:"volumeID"`
	CapacityBytes int64             `json:"capacityBytes"`
	VolumeContext map[string]string `json:"volumeContext,omitempty"`
	// OpenBy names the clients that have the image open (ceph-csi's
	// mappings on nodes: their addresses), in a dry run's answer only; the
	// real adoption refuses an image that is open.
	OpenBy []string `json:"openBy,omitempty"`
	DryRun bool     `json:"dryRun,omitempty"`
}
