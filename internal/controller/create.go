package controller

import (
	"context"
	"maps"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// Capability is a validated volume capability, as far as the controller
// side cares: how the volume is used and by whom.
type Capability struct {
	Access backend.AccessType
	Mode   backend.AccessMode
	FsType string // "" when the request leaves it to the driver
}

// CreateRequest is a validated CreateVolume.
type CreateRequest struct {
	Name string
	// Capabilities are one access type and one fs type (the driver
	// checks), since one image serves them all.
	Capabilities []Capability
	// Parameters are the StorageClass's, as the request carries them.
	Parameters        map[string]string
	MutableParameters map[string]string
	// RequiredBytes and LimitBytes are the capacity range; 0 is unset.
	RequiredBytes, LimitBytes int64
	Accessibility             *Accessibility
	// Source, when set, makes the volume a copy of a snapshot or a volume.
	Source *Source
}

// Source is the content source a CreateVolume names.
type Source struct {
	Snapshot bool   // a snapshot; else a volume
	Field    string // the request's field that names it, for messages
	ID       string // as the request has it
}

// Volume describes a volume as CreateVolume, ListVolumes and
// ControllerGetVolume answer it.
type Volume struct {
	ID            string
	CapacityBytes int64
	// Context is what the node stages with: the parameters that shaped
	// the volume, and whether it is encrypted.
	Context  map[string]string
	Topology []Topology
	// SourceSnapshotID or SourceVolumeID: the copy's source.
	SourceSnapshotID, SourceVolumeID string
	PublishedNodes                   []string
}

// CreateVolume creates the volume r asks for, or returns the one created
// under r.Name before if it answers r (a retry); one that does not is
// ErrAlreadyExists.
func (c *Controller) CreateVolume(ctx context.Context, r CreateRequest) (*Volume, error) {
	params, err := c.parseParameters(r.Parameters)
	if err != nil {
		return nil, err
	}
	caps, err := withFsType(r.Capabilities, params.fsType)
	if err != nil {
		return nil, err
	}
	inst := c.instances[params.instance]
	for i, cp := range caps {
		if err := inst.Exporter.SupportsAccess(cp.Access, cp.Mode); err != nil {
			return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_capabilities[%d]", i)
		}
	}
	if err := c.checkAccessibility(inst, r.Accessibility, "accessibility_requirements"); err != nil {
		return nil, err
	}
	source, err := c.resolveSource(ctx, inst, r.Source)
	if err != nil {
		return nil, err
	}
	spec, err := volumeSpec(r, caps[0], params, source)
	if err != nil {
		return nil, err
	}
	release, err := c.locks.Acquire("create/"+r.Name, "volume name "+r.Name)
	if err != nil {
		return nil, err
	}
	defer release()
	// A retried CreateVolume wraps a passphrase again, and the store
	// answers the volume with the key it was created with.
	if spec.Encryption, err = c.newVolumeEncryption(ctx, r.Name, params, source); err != nil {
		return nil, err
	}
	img, err := inst.Store.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return c.describe(inst, img)
}

// withFsType gives mount capabilities that name no filesystem the one of
// parameters csi.storage.k8s.io/fstype; one that names another is refused.
func withFsType(caps []Capability, fsType string) ([]Capability, error) {
	if fsType == "" {
		return caps, nil
	}
	out := make([]Capability, len(caps))
	for i, cp := range caps {
		switch {
		case cp.Access != backend.AccessMount:
		case cp.FsType == "":
			cp.FsType = fsType
		case cp.FsType != fsType:
			return nil, errdefs.InvalidArgument("volume_capabilities[%d].mount.fs_type %q and parameters.%s %q disagree", i, cp.FsType, paramFsType, fsType)
		}
		out[i] = cp
	}
	return out, nil
}

// volumeSpec is what the store is asked for: the first capability's
// access type and filesystem (a copy keeps its source's), and a size that
// fits the request, the filesystem's minimum and the source.
func volumeSpec(r CreateRequest, cp Capability, params volumeParameters, source *contentSource) (backend.VolumeSpec, error) {
	spec := backend.VolumeSpec{
		Name:              r.Name,
		RequiredBytes:     r.RequiredBytes,
		LimitBytes:        r.LimitBytes,
		AccessType:        cp.Access,
		Parameters:        params.shaping,
		MutableParameters: r.MutableParameters,
	}
	var minBytes int64
	if spec.AccessType == backend.AccessMount {
		spec.FsType = cp.FsType
		if spec.FsType == "" && source != nil {
			spec.FsType = source.FsType // a copy keeps the filesystem it holds
		}
		fs, err := blockdev.LookupFilesystem(spec.FsType)
		if err != nil {
			return spec, err
		}
		spec.FsType, minBytes = fs.Name, fs.MinBytes
	}
	if params.encrypted {
		// The filesystem lives on the dm-crypt mapping, after the LUKS2 header.
		minBytes += blockdev.LUKSHeaderBytes
	}
	required, limit := r.RequiredBytes, r.LimitBytes
	if source != nil {
		spec.Source = &source.ContentSource
		// A copy is at least as big as what it copies; without a size it
		// is exactly as big.
		if required == 0 {
			required = source.SizeBytes
		}
		if limit > 0 && limit < source.SizeBytes {
			return spec, errdefs.OutOfRange("capacity_range.limit_bytes %d is smaller than the %d-byte source %s", limit, source.SizeBytes, source.id)
		}
	}
	var err error
	if spec.CapacityBytes, err = ResolveCapacity(required, limit, minBytes); err != nil {
		return spec, err
	}
	if source != nil {
		// The store checks again, with what it holds now.
		if err := backend.CopyFits(spec, source.CopySource); err != nil {
			return spec, err
		}
	}
	return spec, nil
}

// contentSource is a resolved content source and what the new volume
// inherits from it.
type contentSource struct {
	backend.ContentSource
	backend.CopySource
	id         string // the CSI ID, for messages
	encryption *backend.Encryption
}

// resolveSource looks a content source up. A source that cannot exist (not
// a Spindle ID) or does not exist is NOT_FOUND; one in another backend
// instance is INVALID_ARGUMENT, since images are copied within a pool.
func (c *Controller) resolveSource(ctx context.Context, inst *backend.Instance, src *Source) (*contentSource, error) {
	if src == nil {
		return nil, nil
	}
	id, err := volumeid.Parse(src.ID)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrNotFound, err, "%s %q names no Spindle volume or snapshot", src.Field, src.ID)
	}
	if id.InstanceKey() != inst.Key() {
		return nil, errdefs.InvalidArgument("%s %q is in backend %s; a copy is made within one backend instance, and this volume goes to %s", src.Field, src.ID, id.InstanceKey(), inst.Key())
	}
	out := &contentSource{id: src.ID}
	if src.Snapshot {
		if inst.Snapshots == nil {
			return nil, errdefs.InvalidArgument("backend %s takes no snapshots", inst.Key())
		}
		snap, err := inst.Snapshots.GetSnapshot(ctx, id.Image)
		if err != nil {
			return nil, err
		}
		out.SnapshotID, out.encryption = snap.ID, snap.Encryption
		out.CopySource = backend.CopySource{SizeBytes: snap.SizeBytes, AccessType: snap.AccessType, FsType: snap.FsType}
		return out, nil
	}
	img, err := inst.Store.Get(ctx, id.Image)
	if err != nil {
		return nil, err
	}
	out.ImageID, out.encryption = img.ID, img.Encryption
	out.CopySource = backend.CopySource{SizeBytes: img.CapacityBytes, AccessType: img.AccessType, FsType: img.FsType}
	return out, nil
}

// describe is an image as the CSI services describe the volume.
func (c *Controller) describe(inst *backend.Instance, img *backend.Image) (*Volume, error) {
	id, err := volumeid.New(inst.Type, inst.Name, img.ID)
	if err != nil {
		return nil, err
	}
	vol := &Volume{
		ID:             id.String(),
		CapacityBytes:  img.CapacityBytes,
		Context:        maps.Clone(img.Parameters),
		Topology:       c.accessibleTopology(inst),
		PublishedNodes: publishedNodes(img),
	}
	if img.Encryption != nil {
		// A copy of an encrypted source is encrypted whatever its
		// StorageClass said.
		if vol.Context == nil {
			vol.Context = map[string]string{}
		}
		vol.Context[paramEncrypted] = "true"
		vol.Context[paramEncryptionKMSID] = img.Encryption.KMSID
	}
	if src := img.Source; src != nil {
		switch {
		case src.SnapshotID != "":
			vol.SourceSnapshotID = inst.Key() + "/" + src.SnapshotID
		case src.ImageID != "":
			vol.SourceVolumeID = inst.Key() + "/" + src.ImageID
		}
	}
	return vol, nil
}

func publishedNodes(img *backend.Image) []string {
	nodes := make([]string, 0, len(img.Attachments))
	for _, a := range img.Attachments {
		nodes = append(nodes, a.NodeID)
	}
	return nodes
}

// DeleteVolume deletes the volume id, and an encrypted volume's key; a
// volume already gone is deleted.
func (c *Controller) DeleteVolume(ctx context.Context, id volumeid.ID) error {
	// An ID that is ours but whose backend is not configured here is an
	// error: answering "deleted" would make Kubernetes forget an image
	// that still exists.
	inst, release, err := c.lockVolume(id)
	if err != nil {
		return err
	}
	defer release()
	// An encrypted volume's key goes first, once nothing holds the volume:
	// deleting the image first could leave a key no retry finds again.
	// An image already gone is the backend's Delete to answer; any other
	// failure to read it is this call's answer (trying the delete anyway
	// would spend a second timeout on a cluster that did not answer).
	img, err := inst.Store.Get(ctx, id.Image)
	switch {
	case err == nil && img.Encryption != nil && len(img.Attachments) == 0:
		if err := c.forgetKey(ctx, img.Encryption); err != nil {
			return err
		}
	case err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound:
		return err
	}
	return inst.Store.Delete(ctx, id.Image)
}
