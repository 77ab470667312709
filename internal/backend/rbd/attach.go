package rbd

import (
	"context"
	"strings"

	"github.com/spindle-csi/spindle/internal/backend"
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
	Available(ctx context.Context) error
}

// mapped is one device of an image.
type mapped struct {
	Device   string
	Image    string
	ReadOnly bool
}

// source is the store as the node reads it.
type source struct{ *Store }

// CheckAttach: the controller's pool and image must be this node's.
func (s source) CheckAttach(_ context.Context, img *backend.Image, req backend.AttachRequest) error {
	image, err := s.imageOf(img.ID, volumePrefix, "volume")
	if err != nil {
		return err
	}
	for key, want := range map[string]string{ContextPool: s.cfg.Pool, ContextImage: image} {
		if got, ok := req.PublishContext[key]; ok && got != want {
			return errdefs.Precondition("the controller published %s=%q but this node's config gives %q: controller and node configurations disagree", key, got, want)
		}
	}
	return nil
}

// Probe: nothing to check from the node without credentials (the node
// reaches the cluster with NodeStage's secrets); the transport says
// whether this node can map images at all.
func (source) Probe(context.Context) error { return nil }

// RecordFormatted notes the filesystem in spindle.formatted.
func (s *Store) RecordFormatted(ctx context.Context, imageID, fsType string) error {
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

// transport maps images with the configured mapper. Before it maps an
// image read-write it checks the image's watchers: any client that has the
// image open is another node (or a client that died less than 30 s ago)
// that may still write it, and mapping it a second time would silently
// corrupt it.
type transport struct {
	s *Store
	m mapper
}

var _ backend.Transport = (*transport)(nil)

// Map implements backend.Transport.
func (t *transport) Map(ctx context.Context, req backend.MapRequest) (string, error) {
	s := t.s
	image, err := s.imageOf(req.Image.ID, volumePrefix, "volume")
	if err != nil {
		return "", err
	}
	if !req.ReadOnly {
		w, err := s.watchers(ctx, image)
		if err != nil {
			return "", err
		}
		if len(w) > 0 {
			return "", errdefs.Precondition("image %s of volume %s still has watchers %s: another node (or a client that died less than 30 s ago) has it open; refusing a second writer%s",
				s.spec(image), req.Image.ID, strings.Join(w, ", "), fencingHint(s.cfg.Fencing))
		}
	}
	opts := s.cfg.MapOptions
	if v, ok := req.Image.MutableParameters[MutableParamMapOptions]; ok {
		opts = v
	}
	return t.m.Map(ctx, image, req.ReadOnly, opts)
}

func fencingHint(on bool) string {
	if on {
		return ""
	}
	return " (if that node is lost, force-detach the volume from it; with fencing enabled the controller then blocklists it)"
}

// Unmap implements backend.Transport. It needs no credentials: NodeUnstage
// carries no secrets, and unmapping is local.
func (t *transport) Unmap(ctx context.Context, imageID, devicePath string) error {
	image, err := t.s.imageOf(imageID, volumePrefix, "volume")
	if err != nil {
		return nil // no image of ours, so no device of ours
	}
	return t.m.Unmap(ctx, image, devicePath)
}

// Mapped implements backend.Transport.
func (t *transport) Mapped(ctx context.Context, imageID string) ([]backend.MappedDevice, error) {
	image, err := t.s.imageOf(imageID, volumePrefix, "volume")
	if err != nil {
		return nil, nil
	}
	devs, err := t.m.Mapped(ctx, image)
	if err != nil {
		return nil, err
	}
	out := make([]backend.MappedDevice, 0, len(devs))
	for _, d := range devs {
		out = append(out, backend.MappedDevice{Path: d.Device, ReadOnly: d.ReadOnly})
	}
	return out, nil
}

// Identify implements backend.Transport.
func (t *transport) Identify(ctx context.Context, imageID, devicePath string) (*backend.MappedDevice, error) {
	image, err := t.s.imageOf(imageID, volumePrefix, "volume")
	if err != nil {
		return nil, errdefs.NotFound("%s is not a device of volume %s: %v", devicePath, imageID, err)
	}
	got, err := t.m.Identify(ctx, devicePath)
	switch kind := errdefs.KindOf(err); {
	case err == nil:
	case kind == errdefs.ErrNotFound, kind == errdefs.ErrInvalidArgument:
		return nil, errdefs.NotFound("%s is not a device of volume %s: %v", devicePath, imageID, err)
	default:
		return nil, err
	}
	if got.Image != image {
		return nil, errdefs.NotFound("%s is image %s, not volume %s", devicePath, t.s.spec(got.Image), imageID)
	}
	return &backend.MappedDevice{Path: got.Device, ReadOnly: got.ReadOnly}, nil
}

// Refresh implements backend.Transport.
func (t *transport) Refresh(ctx context.Context, _, devicePath string) (int64, error) {
	return t.m.Refresh(ctx, devicePath)
}

// Available implements backend.Transport: this node can map images.
func (t *transport) Available(ctx context.Context) error { return t.m.Available(ctx) }
