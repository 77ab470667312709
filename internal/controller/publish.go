package controller

import (
	"context"
	"errors"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// PublishRequest is a validated ControllerPublishVolume of a Spindle volume.
type PublishRequest struct {
	ID         volumeid.ID
	NodeID     string
	Capability Capability
	ReadOnly   bool
}

// lockPublish takes the lock of the volume on one node: publishes of the
// volume to other nodes go on meanwhile.
func (c *Controller) lockPublish(id volumeid.ID, nodeID string) (func(), error) {
	return c.locks.Acquire("publish/"+id.String()+"/"+nodeID, "volume "+id.String()+" on node "+nodeID)
}

// Publish grants the node access to the volume as r asks and returns the
// publish_context the node stages with. The backend's exporter admits the
// access mode: a single-node volume published to another node is
// ErrPrecondition naming that node.
func (c *Controller) Publish(ctx context.Context, r PublishRequest) (map[string]string, error) {
	inst, err := c.instances.Serving(r.ID)
	if err != nil {
		return nil, err
	}
	if err := inst.Exporter.SupportsAccess(r.Capability.Access, r.Capability.Mode); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_capability")
	}
	release, err := c.lockPublish(r.ID, r.NodeID)
	if err != nil {
		return nil, err
	}
	defer release()
	img, err := inst.Store.Get(ctx, r.ID.Image)
	if err != nil {
		return nil, err
	}
	if err := capabilityFits(img, r.Capability); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_capability")
	}
	pc, err := inst.Exporter.Publish(ctx, r.ID.Image, backend.Attachment{
		NodeID:     r.NodeID,
		AccessMode: r.Capability.Mode,
		ReadOnly:   r.ReadOnly || r.Capability.Mode.ReadOnly(),
		Since:      time.Now().UTC().Truncate(time.Second),
	})
	if err != nil {
		return nil, err
	}
	return addEncryptionContext(pc, img.Encryption), nil
}

// PublishStatic publishes a pre-provisioned volume (its handle and volume
// attributes; field names the handle's field for messages): the node is
// told where the image is; nothing is granted or recorded, so the volume's
// exclusive use rests on the attach-detach controller and on the node's
// check of the image's watchers before a read-write map.
func (c *Controller) PublishStatic(field, handle string, attrs map[string]string, cp Capability, readOnly bool) (map[string]string, error) {
	inst, sv, image, err := c.instances.Static(field, handle, attrs)
	if err != nil {
		return nil, err
	}
	if err := inst.Exporter.SupportsAccess(cp.Access, cp.Mode); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_capability")
	}
	pc, err := sv.StaticPublishContext(image, attrs)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_context")
	}
	if readOnly || cp.Mode.ReadOnly() {
		pc[backend.ContextReadOnly] = "true"
	}
	return pc, nil
}

// capabilityFits refuses a capability the volume was not made for: a
// block volume's raw data must not be formatted over, and a filesystem
// volume keeps its fs type.
func capabilityFits(img *backend.Image, cp Capability) error {
	if img.AccessType != cp.Access {
		return errdefs.InvalidArgument("volume %s was created for %s access, not %s", img.ID, img.AccessType, cp.Access)
	}
	if cp.FsType != "" && img.FsType != "" && cp.FsType != img.FsType {
		return errdefs.InvalidArgument("volume %s holds %s, not %s", img.ID, img.FsType, cp.FsType)
	}
	return nil
}

// Unpublish revokes the node's access to the volume; with no node, every
// node's, as the spec asks. A volume that is gone is unpublished.
func (c *Controller) Unpublish(ctx context.Context, id volumeid.ID, nodeID string) error {
	inst, err := c.instances.Serving(id)
	if err != nil {
		return err
	}
	release, err := c.lockPublish(id, nodeID)
	if err != nil {
		return err
	}
	defer release()
	nodes := []string{nodeID}
	if nodeID == "" {
		img, err := inst.Store.Get(ctx, id.Image)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		nodes = publishedNodes(img)
	}
	for _, n := range nodes {
		if err := inst.Exporter.Unpublish(ctx, id.Image, n); err != nil {
			return err
		}
	}
	return nil
}

// ValidateCapabilities answers ValidateVolumeCapabilities for a volume
// that exists: unsupported is nil when the volume serves every capability
// with the parameters, else why not (an answer, not an error); err is for
// a volume that cannot be looked up. The capabilities are checked in
// order, each named by its index.
func (c *Controller) ValidateCapabilities(ctx context.Context, id volumeid.ID, params map[string]string, caps []Capability) (unsupported, err error) {
	inst, img, err := c.image(ctx, id)
	if err != nil {
		return nil, err
	}
	if _, err := c.parseParameters(params); err != nil {
		return err, nil
	}
	for i, cp := range caps {
		err := inst.Exporter.SupportsAccess(cp.Access, cp.Mode)
		if err == nil {
			err = capabilityFits(img, cp)
		}
		if err != nil {
			return errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_capabilities[%d]", i), nil
		}
	}
	return nil, nil
}

// Modify changes a volume's mutable parameters (its
// VolumeAttributesClass); the backend says which it understands, and they
// take effect when the volume is next attached. With none, the volume must
// still exist.
func (c *Controller) Modify(ctx context.Context, id volumeid.ID, mutable map[string]string) error {
	inst, release, err := c.lockVolume(id)
	if err != nil {
		return err
	}
	defer release()
	if len(mutable) == 0 {
		_, err := inst.Store.Get(ctx, id.Image)
		return err
	}
	_, err = inst.Store.Modify(ctx, id.Image, mutable)
	return err
}

// Expand grows the volume's image to the capacity range and returns its
// size; the node then refreshes its device and grows the filesystem. An
// image never shrinks.
func (c *Controller) Expand(ctx context.Context, id volumeid.ID, required, limit int64) (int64, error) {
	inst, release, err := c.lockVolume(id)
	if err != nil {
		return 0, err
	}
	defer release()
	img, err := inst.Store.Get(ctx, id.Image)
	if err != nil {
		return 0, err
	}
	size, err := ResolveCapacity(required, limit, 0)
	if err != nil {
		return 0, err
	}
	if _, err := backend.CheckExpand(id.String(), img.CapacityBytes, size); err != nil {
		return 0, err
	}
	if img, err = inst.Store.Expand(ctx, id.Image, size); err != nil {
		return 0, err
	}
	return img.CapacityBytes, nil
}
