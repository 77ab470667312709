package rbd

import (
	"context"
	"fmt"
	"strings"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// mapper turns an image of the instance's pool into a block device on this
// node and back: krbd, rbd-nbd or rbd-fuse + loop.
type mapper interface {
	// Map maps the image and returns the device path.
	Map(ctx context.Context, image string, readOnly bool, options string) (string, error)
	// Unmap releases dev, a device of image; one that is not mapped is done.
	Unmap(ctx context.Context, image, dev string) error
	// Mapped lists the image's devices on this node.
	Mapped(ctx context.Context, image string) ([]mapped, error)
	// Identify says which image of the instance's pool dev is mapped to:
	// ErrNotFound when it is not such a device.
	Identify(ctx context.Context, dev string) (*mapped, error)
	// Refresh makes dev see its image's current size and returns it.
	Refresh(ctx context.Context, dev string) (int64, error)
	// Available reports whether this node can map images this way.
	Available() error
}

// mapped is one device of an image.
type mapped struct {
	Device   string
	Image    string
	ReadOnly bool
}

// Attacher maps images on this node.
type Attacher struct {
	s *Store
	m mapper
}

var _ backend.Attacher = (*Attacher)(nil)

// Attach implements backend.Attacher. Before it maps an image read-write
// it checks the image's watchers: any client that has the image open is
// another node (or a client that died less than 30 s ago) that may still
// write it, and mapping it a second time would silently corrupt it.
func (a *Attacher) Attach(ctx context.Context, req backend.AttachRequest) (*backend.Device, error) {
	s := a.s
	image, err := s.imageOf(req.ImageID, volumePrefix, "volume")
	if err != nil {
		return nil, err
	}
	img, err := s.Get(ctx, req.ImageID)
	if err != nil {
		return nil, err
	}
	att, err := backend.GrantOf(img, req.NodeID)
	if err != nil {
		return nil, err
	}
	for key, want := range map[string]string{ContextPool: s.cfg.Pool, ContextImage: image} {
		if got, ok := req.PublishContext[key]; ok && got != want {
			return nil, errdefs.Precondition("the controller published %s=%q but this node's config gives %q: controller and node configurations disagree", key, got, want)
		}
	}
	readOnly := req.ReadOnly || att.ReadOnly || att.AccessMode.ReadOnly()

	devs, err := a.m.Mapped(ctx, image)
	if err != nil {
		return nil, err
	}
	for _, d := range devs {
		if d.ReadOnly == readOnly {
			return a.device(img, d), nil
		}
	}
	if !readOnly {
		w, err := s.watchers(ctx, image)
		if err != nil {
			return nil, err
		}
		if len(w) > 0 {
			return nil, errdefs.Precondition("image %s of volume %s still has watchers %s: another node (or a client that died less than 30 s ago) has it open; refusing a second writer%s",
				s.spec(image), req.ImageID, strings.Join(w, ", "), fencingHint(s.cfg.Fencing))
		}
	}
	opts := s.cfg.MapOptions
	if v, ok := img.MutableParameters[MutableParamMapOptions]; ok {
		opts = v
	}
	dev, err := a.m.Map(ctx, image, readOnly, opts)
	if err != nil {
		return nil, err
	}
	// Prove the device is our image before anyone formats or mounts it.
	got, err := a.m.Identify(ctx, dev)
	if err != nil {
		return nil, fmt.Errorf("identify %s, just mapped for image %s: %w", dev, s.spec(image), err)
	}
	if got.Image != image {
		return nil, errdefs.Precondition("%s was mapped for image %s but is image %s; refusing to use it", dev, s.spec(image), got.Image)
	}
	if got.ReadOnly != readOnly {
		_ = a.m.Unmap(context.WithoutCancel(ctx), image, dev)
		return nil, errdefs.Precondition("%s came up with read-only=%t, asked for %t", dev, got.ReadOnly, readOnly)
	}
	return a.device(img, *got), nil
}

func fencingHint(on bool) string {
	if on {
		return ""
	}
	return " (if that node is lost, force-detach the volume from it; with fencing enabled the controller then blocklists it)"
}

func (a *Attacher) device(img *backend.Image, d mapped) *backend.Device {
	return backend.DeviceOf(img, d.Device, d.ReadOnly)
}

// Detach implements backend.Attacher. It needs no credentials: NodeUnstage
// carries no secrets, and unmapping is local.
func (a *Attacher) Detach(ctx context.Context, imageID, devicePath string) error {
	image, err := a.s.imageOf(imageID, volumePrefix, "volume")
	if err != nil {
		return nil
	}
	devs, err := a.m.Mapped(ctx, image)
	if err != nil {
		return err
	}
	for _, d := range devs {
		if devicePath != "" && d.Device != devicePath {
			continue
		}
		busy, err := blockdev.InUse(d.Device)
		if err != nil {
			return err
		}
		if busy {
			return errdefs.Precondition("%s of volume %s is still in use (mounted or held open exclusively)", d.Device, imageID)
		}
		if err := a.m.Unmap(ctx, image, d.Device); err != nil {
			return err
		}
	}
	return nil
}

// Devices implements backend.Attacher.
func (a *Attacher) Devices(ctx context.Context, imageID string) ([]backend.Device, error) {
	image, err := a.s.imageOf(imageID, volumePrefix, "volume")
	if err != nil {
		return nil, nil
	}
	devs, err := a.m.Mapped(ctx, image)
	if err != nil {
		return nil, err
	}
	out := make([]backend.Device, 0, len(devs))
	for _, d := range devs {
		out = append(out, backend.Device{Path: d.Device, ReadOnly: d.ReadOnly})
	}
	return out, nil
}

// Identify implements backend.Attacher.
func (a *Attacher) Identify(ctx context.Context, imageID, devicePath string) (*backend.Device, error) {
	image, err := a.s.imageOf(imageID, volumePrefix, "volume")
	if err != nil {
		return nil, errdefs.NotFound("%s is not a device of volume %s: %v", devicePath, imageID, err)
	}
	got, err := a.m.Identify(ctx, devicePath)
	switch errdefs.KindOf(err) {
	case nil:
	case errdefs.ErrNotFound, errdefs.ErrInvalidArgument:
		return nil, errdefs.NotFound("%s is not a device of volume %s: %v", devicePath, imageID, err)
	default:
		return nil, err
	}
	if got.Image != image {
		return nil, errdefs.NotFound("%s is image %s, not volume %s", devicePath, a.s.spec(got.Image), imageID)
	}
	return &backend.Device{Path: got.Device, ReadOnly: got.ReadOnly}, nil
}

// Refresh implements backend.Attacher.
func (a *Attacher) Refresh(ctx context.Context, imageID, devicePath string) (int64, error) {
	if _, err := a.Identify(ctx, imageID, devicePath); err != nil {
		return 0, err
	}
	return a.m.Refresh(ctx, devicePath)
}

// RecordFormatted implements backend.Attacher.
func (a *Attacher) RecordFormatted(ctx context.Context, imageID, fsType string) error {
	s := a.s
	image, err := s.imageOf(imageID, volumePrefix, "volume")
	if err != nil {
		return err
	}
	defer s.locks.lock(image)()
	img, err := s.Get(ctx, imageID)
	if err != nil {
		return err
	}
	if img.Formatted && img.FsType == fsType {
		return nil
	}
	return s.setMeta(ctx, image, map[string]string{metaFormatted: fsType})
}

// RegisterNode implements backend.Attacher (see Store.RegisterNode).
func (a *Attacher) RegisterNode(ctx context.Context, info backend.NodeInfo) error {
	return a.s.RegisterNode(ctx, info)
}

// Probe implements backend.Attacher: this node can map images.
func (a *Attacher) Probe(context.Context) error { return a.m.Available() }
