package backend

import (
	"context"
	"fmt"
	"time"

	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Transport turns an image into a local block device on this node and
// back, one way: losetup, iscsiadm, qemu-storage-daemon + FUSE + loop,
// krbd, rbd-nbd, rbd-fuse + loop. TransportAttacher runs the one attach
// algorithm over it.
type Transport interface {
	// Map makes a new device for req.Image and returns its path.
	Map(ctx context.Context, req MapRequest) (string, error)
	// Unmap releases devicePath, a device of the image (the attacher has
	// found it among Mapped and checked that nothing holds it). A device
	// that is no longer mapped is done.
	Unmap(ctx context.Context, imageID, devicePath string) error
	// Mapped lists the image's devices on this node, stale ones included.
	Mapped(ctx context.Context, imageID string) ([]MappedDevice, error)
	// Identify proves that devicePath is a device of the image, looking
	// at that one device only: ErrNotFound when it is not (another image's
	// device, no device at all, a stale one).
	Identify(ctx context.Context, imageID, devicePath string) (*MappedDevice, error)
	// Refresh makes devicePath, proven to be the image's, see the image's
	// current size, and returns the device's size in bytes.
	Refresh(ctx context.Context, imageID, devicePath string) (int64, error)
	// Available reports whether this node can attach images this way.
	Available(ctx context.Context) error
}

// SessionTransport is a Transport that keeps per-image state on the node
// beside the image's devices (an iSCSI login, a qemu-storage-daemon):
// Release ends it once the image has no device left here.
type SessionTransport interface {
	Transport
	Release(ctx context.Context, imageID string) error
}

// MapRequest is what a Transport maps.
type MapRequest struct {
	Image          *Image
	NodeID         string
	PublishContext map[string]string
	ReadOnly       bool
}

// MappedDevice is one device of an image as its transport sees it.
type MappedDevice struct {
	Path     string
	ReadOnly bool
	// Stale: bound to an image that is gone (a loop device on an unlinked
	// file), to be detached but never used.
	Stale bool
	// NotReusable: the device may not be handed to a new attach (a loop
	// device whose detach the kernel deferred goes at its last close).
	NotReusable bool
}

// AttachSource is the node's view of an image store: the records the
// attacher reads and writes.
type AttachSource interface {
	// Get returns the image, or ErrNotFound.
	Get(ctx context.Context, imageID string) (*Image, error)
	// CheckAttach refuses an attach whose publish_context names something
	// other than what this node derives for the image: the controller's
	// and the node's configurations disagree (ErrPrecondition), or the
	// context is malformed (ErrInvalidArgument).
	CheckAttach(ctx context.Context, img *Image, req AttachRequest) error
	// RecordFormatted notes in the image's metadata that it holds fsType.
	RecordFormatted(ctx context.Context, imageID, fsType string) error
	// RegisterNode announces the node to the store.
	RegisterNode(ctx context.Context, info NodeInfo) error
	// Probe reports whether the store is reachable from this node.
	Probe(ctx context.Context) error
}

// ContextGrants is implemented by attach sources whose node reads no image
// store: the controller's publish_context is the grant and carries what the
// node must know of the image (iSCSI nodes have only the target's portal,
// the publish_context and the CHAP secret). TransportAttacher then takes
// the image and the grant from it instead of Get and GrantOf.
type ContextGrants interface {
	// Grant returns what the request's publish_context says of the image
	// (its ID and, where the controller said, Formatted, FsType and
	// AccessType) and of this node's grant, or ErrPrecondition when it
	// does not grant this node access.
	Grant(ctx context.Context, req AttachRequest) (*Image, *Attachment, error)
}

// TransportAttacher is the one Attacher: it finds the node's grant,
// applies the read-only rule, reuses a device that is already attached
// with that setting, or maps a new one and proves it is the image before
// anyone formats or mounts it, unmapping it otherwise.
type TransportAttacher struct {
	Source    AttachSource
	Transport Transport
	// InUse tells whether something holds a device (a mount, an exclusive
	// open); blockdev.InUse when nil. A transport whose devices are faked
	// in tests answers for them here.
	InUse func(devicePath string) (bool, error)
	// NoGrants attaches images the controller grants nothing for
	// (pre-provisioned volumes, StaticVolumes): the read-only rule is the
	// request's alone.
	NoGrants bool
}

var _ Attacher = (*TransportAttacher)(nil)

// Attach implements Attacher.
func (a *TransportAttacher) Attach(ctx context.Context, req AttachRequest) (*Device, error) {
	img, grant, err := a.grant(ctx, req)
	if err != nil {
		return nil, err
	}
	readOnly := req.ReadOnly
	if grant != nil {
		readOnly = readOnly || grant.ReadOnly || grant.AccessMode.ReadOnly()
	}
	if err := a.Source.CheckAttach(ctx, img, req); err != nil {
		return nil, err
	}
	devs, err := a.Transport.Mapped(ctx, img.ID)
	if err != nil {
		return nil, err
	}
	for _, d := range devs {
		if !d.Stale && !d.NotReusable && d.ReadOnly == readOnly {
			return DeviceOf(img, d.Path, d.ReadOnly), nil
		}
	}
	path, err := a.Transport.Map(ctx, MapRequest{Image: img, NodeID: req.NodeID, PublishContext: req.PublishContext, ReadOnly: readOnly})
	if err != nil {
		return nil, err
	}
	got, err := a.Transport.Identify(ctx, img.ID, path)
	if err != nil {
		// Not proven to be the image's: it is not ours to unmap either.
		if errdefs.KindOf(err) == errdefs.ErrNotFound {
			err = errdefs.Wrap(errdefs.ErrPrecondition, err, "%s, just mapped for volume %s, is not its device; refusing to use it", path, img.ID)
		}
		return nil, err
	}
	if got.ReadOnly != readOnly {
		err := errdefs.Precondition("%s came up with read-only=%t, asked for %t", path, got.ReadOnly, readOnly)
		if uerr := a.Transport.Unmap(context.WithoutCancel(ctx), img.ID, path); uerr != nil {
			err = fmt.Errorf("%w (and unmapping it failed: %v)", err, uerr)
		}
		return nil, err
	}
	return DeviceOf(img, got.Path, got.ReadOnly), nil
}

// grant is the image and this node's grant of it: from the store, or from
// the publish_context when the source reads no store (ContextGrants). With
// NoGrants the grant is nil: the controller granted nothing.
func (a *TransportAttacher) grant(ctx context.Context, req AttachRequest) (*Image, *Attachment, error) {
	if g, ok := a.Source.(ContextGrants); ok {
		return g.Grant(ctx, req)
	}
	img, err := a.Source.Get(ctx, req.ImageID)
	if err != nil {
		return nil, nil, err
	}
	if a.NoGrants {
		return img, nil, nil
	}
	grant, err := GrantOf(img, req.NodeID)
	if err != nil {
		return nil, nil, err
	}
	return img, grant, nil
}

// Detach implements Attacher: each of the image's devices (devicePath
// only, when set) that nothing holds is unmapped; the first one still in
// use is ErrPrecondition. A transport with per-image state releases it
// once no device is left.
func (a *TransportAttacher) Detach(ctx context.Context, imageID, devicePath string) error {
	devs, err := a.Transport.Mapped(ctx, imageID)
	if err != nil {
		return err
	}
	left := 0
	for _, d := range devs {
		if devicePath != "" && d.Path != devicePath {
			left++
			continue
		}
		if err := a.awaitIdle(ctx, imageID, d.Path); err != nil {
			return err
		}
		if err := a.Transport.Unmap(ctx, imageID, d.Path); err != nil {
			return err
		}
	}
	if st, ok := a.Transport.(SessionTransport); ok && left == 0 {
		return st.Release(ctx, imageID)
	}
	return nil
}

// Bounds of awaitIdle: a filesystem just unmounted can hold its device for
// a moment more (seen with xfs on a loaded node); a mount that stays is
// refused.
const (
	idleWait = time.Second
	idlePoll = 20 * time.Millisecond
)

// awaitIdle waits until nothing holds dev exclusively, or refuses.
func (a *TransportAttacher) awaitIdle(ctx context.Context, imageID, dev string) error {
	inUse := a.InUse
	if inUse == nil {
		inUse = blockdev.InUse
	}
	deadline := time.Now().Add(idleWait)
	for {
		busy, err := inUse(dev)
		if err != nil || !busy {
			return err
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return errdefs.Precondition("%s of volume %s is still in use (mounted or held open exclusively)", dev, imageID)
		}
		select {
		case <-ctx.Done():
		case <-time.After(idlePoll):
		}
	}
}

// Devices implements Attacher.
func (a *TransportAttacher) Devices(ctx context.Context, imageID string) ([]Device, error) {
	devs, err := a.Transport.Mapped(ctx, imageID)
	if err != nil {
		return nil, err
	}
	out := make([]Device, 0, len(devs))
	for _, d := range devs {
		if !d.Stale {
			out = append(out, Device{Path: d.Path, ReadOnly: d.ReadOnly})
		}
	}
	return out, nil
}

// Identify implements Attacher.
func (a *TransportAttacher) Identify(ctx context.Context, imageID, devicePath string) (*Device, error) {
	d, err := a.Transport.Identify(ctx, imageID, devicePath)
	if err != nil {
		return nil, err
	}
	if d.Stale {
		return nil, errdefs.NotFound("%s is bound to a deleted copy of volume %s", devicePath, imageID)
	}
	return &Device{Path: d.Path, ReadOnly: d.ReadOnly}, nil
}

// Refresh implements Attacher.
func (a *TransportAttacher) Refresh(ctx context.Context, imageID, devicePath string) (int64, error) {
	if _, err := a.Identify(ctx, imageID, devicePath); err != nil {
		return 0, err
	}
	return a.Transport.Refresh(ctx, imageID, devicePath)
}

// RecordFormatted implements Attacher.
func (a *TransportAttacher) RecordFormatted(ctx context.Context, imageID, fsType string) error {
	return a.Source.RecordFormatted(ctx, imageID, fsType)
}

// RegisterNode implements Attacher.
func (a *TransportAttacher) RegisterNode(ctx context.Context, info NodeInfo) error {
	return a.Source.RegisterNode(ctx, info)
}

// Probe implements Attacher: the store is reachable and this node can
// attach its images.
func (a *TransportAttacher) Probe(ctx context.Context) error {
	if err := a.Source.Probe(ctx); err != nil {
		return err
	}
	return a.Transport.Available(ctx)
}
