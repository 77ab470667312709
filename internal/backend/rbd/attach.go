package rbd

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spindle-csi/spindle/internal/atomicfile"
	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// mapper turns an image into a block device on this node and back: krbd,
// rbd-nbd or rbd-fuse + loop. A node holds one of each kind; a volume is
// mapped with the one its parameters name (ceph-csi's mounter), else the
// instance's.
type mapper interface {
	// Map maps the image with the given map options and returns the
	// device path.
	Map(ctx context.Context, r ref, readOnly bool, options string) (string, error)
	// Unmap releases dev, a device of r, with the given unmap options;
	// one that is not mapped is done.
	Unmap(ctx context.Context, r ref, dev, options string) error
	// Mapped lists r's devices on this node.
	Mapped(ctx context.Context, r ref) ([]mapped, error)
	// Identify says which image dev (a device expected to be r's) is
	// mapped to: ErrNotFound when it is not such a device.
	Identify(ctx context.Context, r ref, dev string) (*mapped, error)
	// Refresh makes dev, a device of r, see r's current size and returns it.
	Refresh(ctx context.Context, r ref, dev string) (int64, error)
	// Available reports whether this node can map images this way.
	Available(ctx context.Context) error
	// Makes reports whether dev is the kind of device this mapper makes
	// (/dev/rbdN, /dev/nbdN, /dev/loopN).
	Makes(dev string) bool
}

// mapped is one device of an image. The kernel says which pool, namespace
// and image a device is of, not which cluster.
type mapped struct {
	Device    string
	Pool      string
	Namespace string
	Image     string
	ReadOnly  bool
}

// of reports whether the device is of image r.
func (m *mapped) of(r ref) bool {
	return m.Pool == r.pool && m.Namespace == r.namespace && m.Image == r.image
}

// spec is the device's image spec, for messages.
func (m *mapped) spec() string {
	return location{pool: m.Pool, namespace: m.Namespace}.ref(m.Image).spec()
}

// source is the store as the node reads it.
type source struct{ *Store }

// CheckAttach: the controller's cluster, pool, namespace and image must be
// those of the volume ID.
func (s source) CheckAttach(_ context.Context, img *backend.Image, req backend.AttachRequest) error {
	r, err := s.volumeRef(img.ID)
	if err != nil {
		return err
	}
	return checkContext(r, req.PublishContext)
}

// checkContext refuses a publish_context that names another image than r.
func checkContext(r ref, pc map[string]string) error {
	for key, want := range map[string]string{ContextClusterID: r.cluster, ContextPool: r.pool, ContextNamespace: r.namespace, ContextImage: r.image} {
		if got, ok := pc[key]; ok && got != want {
			return errdefs.Precondition("the controller published %s=%q but the volume ID gives %q: controller and node disagree about the volume", key, got, want)
		}
	}
	return nil
}

// Probe: nothing to check from the node without credentials (the node
// reaches the cluster with NodeStage's secrets); the transport says
// whether this node can map images at all.
func (source) Probe(context.Context) error { return nil }

// RecordFormatted notes the filesystem in spindle.formatted, with one
// Ceph client call: the node asks only when the image it read at this
// stage showed no filesystem, and setting the one key again is harmless.
// Reading the image first cost two more calls per first stage, each 7-16
// s on a loaded emulated node, where encrypted stages already ran past
// kubelet's 2 minutes and were undone and retried whole.
func (s *Store) RecordFormatted(ctx context.Context, imageID, fsType string) error {
	r, err := s.volumeRef(imageID)
	if err != nil {
		return err
	}
	defer s.locks.lock(imageID)()
	return s.setMeta(ctx, r, map[string]string{metaFormatted: fsType})
}

// transport maps images with the mapper of each volume's mounter. Before
// it maps an image read-write it checks the image's watchers: any client
// that has the image open is another node (or a client that died less
// than 30 s ago) that may still write it, and mapping it a second time
// would silently corrupt it.
type transport struct {
	s       *Store
	mappers map[string]mapper // by mounter
}

var _ backend.SessionTransport = (*transport)(nil)

// releaser is a mapper that keeps something per image beside its devices:
// rbd-fuse's mount.
type releaser interface {
	// Release ends what is left of r on this node once r has no device
	// here; something still in use is ErrPrecondition.
	Release(ctx context.Context, r ref) error
}

// Map implements backend.Transport.
func (t *transport) Map(ctx context.Context, req backend.MapRequest) (string, error) {
	s := t.s
	r, err := s.volumeRef(req.Image.ID)
	if err != nil {
		return "", err
	}
	mounter, mapOpts, unmapOpts := s.mapSettings(req.Image, req.PublishContext)
	m, ok := t.mappers[mounter]
	if !ok {
		return "", errdefs.Precondition("volume %s is mapped with %s, which this node plugin does not have", req.Image.ID, mounter)
	}
	if !req.ReadOnly {
		w, err := s.watchers(ctx, r)
		if err != nil {
			return "", err
		}
		if len(w) > 0 {
			return "", errdefs.Precondition("image %s of volume %s still has watchers %s: another node (or a client that died less than 30 s ago) has it open; refusing a second writer%s",
				r.spec(), req.Image.ID, strings.Join(w, ", "), fencingHint(s.cfg.Fencing))
		}
	}
	dev, err := m.Map(ctx, r, req.ReadOnly, mapOpts)
	if err != nil {
		return "", err
	}
	if err := t.recordUnmapOptions(dev, unmapOpts); err != nil {
		if uerr := m.Unmap(context.WithoutCancel(ctx), r, dev, unmapOpts); uerr != nil {
			err = errors.Join(err, uerr)
		}
		return "", err
	}
	return dev, nil
}

func fencingHint(on bool) string {
	if on {
		return ""
	}
	return " (if that node is lost, force-detach the volume from it; with fencing enabled the controller then blocklists it)"
}

// unmapOptionsFile is where the unmap options of a mapped device are kept
// (NodeUnstage carries no parameters).
func (t *transport) unmapOptionsFile(dev string) string {
	return filepath.Join(t.s.cfg.StateDir, strings.TrimPrefix(t.s.key, Type+"/"), "unmap-options", filepath.Base(dev))
}

func (t *transport) recordUnmapOptions(dev, opts string) error {
	file := t.unmapOptionsFile(dev)
	if opts == "" {
		if err := os.Remove(file); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteVolatile(file, []byte(opts), 0o600)
}

// mapperOf is the mapper that makes devices like dev.
func (t *transport) mapperOf(dev string) (mapper, bool) {
	for _, m := range t.mappers {
		if m.Makes(dev) {
			return m, true
		}
	}
	return nil, false
}

// Unmap implements backend.Transport. It needs no credentials: NodeUnstage
// carries no secrets, and unmapping is local.
func (t *transport) Unmap(ctx context.Context, imageID, devicePath string) error {
	r, err := t.s.volumeRef(imageID)
	if err != nil {
		return nil // no image of ours, so no device of ours
	}
	m, ok := t.mapperOf(devicePath)
	if !ok {
		return nil
	}
	b, err := os.ReadFile(t.unmapOptionsFile(devicePath))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := m.Unmap(ctx, r, devicePath, strings.TrimSpace(string(b))); err != nil {
		return err
	}
	return t.recordUnmapOptions(devicePath, "")
}

// Release implements backend.SessionTransport: once the image has no
// device left on this node, neither may a mapper's per-image state be
// (an rbd-fuse mount keeps its watch on the image, and the volume's next
// stage on any node meets it). A mount still in use is a device the
// device list missed: refused, so that NodeUnstage fails and is retried
// rather than reporting a volume released that is not.
func (t *transport) Release(ctx context.Context, imageID string) error {
	r, err := t.s.volumeRef(imageID)
	if err != nil {
		return nil
	}
	for _, name := range mounterOrder {
		if rel, ok := t.mappers[name].(releaser); ok {
			if err := rel.Release(ctx, r); err != nil {
				return err
			}
		}
	}
	return nil
}

// Mapped implements backend.Transport: the image's devices of every kind.
func (t *transport) Mapped(ctx context.Context, imageID string) ([]backend.MappedDevice, error) {
	r, err := t.s.volumeRef(imageID)
	if err != nil {
		return nil, nil
	}
	var out []backend.MappedDevice
	for _, name := range mounterOrder {
		m, ok := t.mappers[name]
		if !ok {
			continue
		}
		devs, err := m.Mapped(ctx, r)
		if err != nil {
			return nil, err
		}
		for _, d := range devs {
			out = append(out, backend.MappedDevice{Path: d.Device, ReadOnly: d.ReadOnly})
		}
	}
	return out, nil
}

// mounterOrder is the order Mapped asks the mappers in.
var mounterOrder = []string{MounterKRBD, MounterNBD, MounterFuse}

// Identify implements backend.Transport.
func (t *transport) Identify(ctx context.Context, imageID, devicePath string) (*backend.MappedDevice, error) {
	r, err := t.s.volumeRef(imageID)
	if err != nil {
		return nil, errdefs.NotFound("%s is not a device of volume %s: %v", devicePath, imageID, err)
	}
	m, ok := t.mapperOf(devicePath)
	if !ok {
		return nil, errdefs.NotFound("%s is not a device of volume %s: no RBD mapper makes such devices", devicePath, imageID)
	}
	got, err := m.Identify(ctx, r, devicePath)
	switch kind := errdefs.KindOf(err); {
	case err == nil:
	case kind == errdefs.ErrNotFound, kind == errdefs.ErrInvalidArgument:
		return nil, errdefs.NotFound("%s is not a device of volume %s: %v", devicePath, imageID, err)
	default:
		return nil, err
	}
	if !got.of(r) {
		return nil, errdefs.NotFound("%s is image %s, not volume %s", devicePath, got.spec(), imageID)
	}
	return &backend.MappedDevice{Path: got.Device, ReadOnly: got.ReadOnly}, nil
}

// Refresh implements backend.Transport.
func (t *transport) Refresh(ctx context.Context, imageID, devicePath string) (int64, error) {
	r, err := t.s.volumeRef(imageID)
	if err != nil {
		return 0, err
	}
	m, ok := t.mapperOf(devicePath)
	if !ok {
		return 0, errdefs.NotFound("%s is not an RBD device", devicePath)
	}
	return m.Refresh(ctx, r, devicePath)
}

// Available implements backend.Transport: this node can map images with
// the instance's mounter (volumes that name another are checked when
// they are mapped).
func (t *transport) Available(ctx context.Context) error {
	return t.mappers[t.s.cfg.Mounter].Available(ctx)
}
