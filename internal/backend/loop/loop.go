// Package loop is Spindle's embedded default backend: sparse image files in a
// pool directory (internal/backend/filestore), exported by recording the
// node in the image's metadata, attached on the node with
// "losetup --direct-io=on" (unless the volume's MutableParamDirectIO says
// "false") and identified through /sys/block/loopN/loop/backing_file.
//
// The pool directory is shared by every node that uses the instance (one
// machine, or a shared filesystem), or is on one node's local disk
// (Config.NodeLocal). Node plugins register themselves in the pool, so the
// controller can tell a node that can reach the pool from one that cannot.
package loop

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/filestore"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Type is the backend name in volume IDs and in the config.
const Type = "loop"

// Keys of the publish_context the controller hands to the node (and that
// operators read in VolumeAttachment.status.attachmentMetadata).
// The read-only flag travels as backend.ContextReadOnly.
const ContextImagePath = "imagePath"

// MutableParamDirectIO is the one mutable (VolumeAttributesClass) parameter
// the loop backend understands: "true" (the default) attaches the image with
// direct I/O, "false" through the page cache of the pool filesystem, for a
// pool where direct I/O is slow or unavailable, at the cost of caching the
// data twice. It takes effect at the next attach of the volume; a device
// already attached keeps its mode.
const MutableParamDirectIO = backend.MutableParamDirectIO

// Config is one loop instance of the config file.
type Config struct {
	PoolDir             string `json:"poolDir"`
	MaxProvisionedBytes int64  `json:"maxProvisionedBytes,omitempty"`
	// NodeLocal says the pool is on this node's local disk, not shared: the
	// instance's volumes are reachable from this node only, and the driver
	// reports topology so that pods follow them.
	NodeLocal bool `json:"nodeLocal,omitempty"`
}

func init() {
	backend.Register(backend.Kind[Config]{Type: Type, Validate: Config.Validate, New: New})
}

// Validate reports every problem of the config; where is its place in the
// config file.
func (c Config) Validate(where string) []error {
	var errs []error
	if !filepath.IsAbs(c.PoolDir) {
		errs = append(errs, fmt.Errorf("%s.poolDir %q: must be an absolute path", where, c.PoolDir))
	}
	if c.MaxProvisionedBytes < 0 {
		errs = append(errs, fmt.Errorf("%s.maxProvisionedBytes: must not be negative", where))
	}
	return errs
}

// New builds the instance named name.
func New(name string, cfg Config, run *command.Runner) (*backend.Instance, error) {
	return NewWithLoopDevices(name, cfg, blockdev.NewLosetup(run))
}

// NewWithLoopDevices builds an instance on the given loop driver (the
// real one, or a blockdev.FakeLoopDevices in tests).
func NewWithLoopDevices(name string, cfg Config, loops blockdev.LoopDevices) (*backend.Instance, error) {
	key := Type + "/" + name
	store, err := filestore.New(filestore.Options{
		Dir:                 cfg.PoolDir,
		Name:                key,
		MaxProvisionedBytes: cfg.MaxProvisionedBytes,
		ValidateMutable:     validateMutable,
	})
	if err != nil {
		return nil, err
	}
	return &backend.Instance{
		Type:  Type,
		Name:  name,
		Store: store,
		// A loop image is one file that one kernel caches: written from one
		// node only, shared across nodes read-only.
		Exporter: &backend.GrantExporter{
			Backend: Type, Instance: key, OneWriterReason: "a loop image can be written from one node only",
			Ledger: store, Hooks: exportHooks{store: store},
		},
		Attacher:  newAttacher(store, loops),
		Snapshots: store,
		NodeLocal: cfg.NodeLocal,
	}, nil
}

// validateMutable accepts MutableParamDirectIO with "true" or "false" and
// nothing else.
var validateMutable = backend.DirectIOOnly(Type)

// directIO says whether the image is to be attached with direct I/O: it
// is, unless the volume says otherwise.
func directIO(img *backend.Image) bool { return backend.DirectIO(img, true) }

// exportHooks give a loop grant its publish_context: the image's path,
// which the node checks against its own view of the pool.
type exportHooks struct {
	backend.NoExportHooks
	store *filestore.Store
}

func (h exportHooks) PublishContext(img *backend.Image) map[string]string {
	return map[string]string{ContextImagePath: h.store.ImagePath(img.ID)}
}

// attacher is backend.TransportAttacher on loop devices, with what only
// the loop backend can tell: every device bound to its pool, and whether an
// image file is still there.
type attacher struct {
	*backend.TransportAttacher
	t *transport
}

var (
	_ backend.DeviceLister = attacher{}
	_ backend.ImageChecker = attacher{}
)

func newAttacher(store *filestore.Store, loops blockdev.LoopDevices) attacher {
	t := &transport{store: store, loops: loops}
	return attacher{
		TransportAttacher: &backend.TransportAttacher{Source: source{store}, Transport: t, InUse: loops.InUse},
		t:                 t,
	}
}

// source is the pool as the node reads it.
type source struct{ *filestore.Store }

// CheckAttach: the controller's image path must be this node's.
func (s source) CheckAttach(_ context.Context, img *backend.Image, req backend.AttachRequest) error {
	path := s.ImagePath(img.ID)
	if p, ok := req.PublishContext[ContextImagePath]; ok && p != path {
		return errdefs.Precondition("the controller published image path %s but this node's pool holds it at %s: controller and node configurations disagree", p, path)
	}
	return nil
}

// transport binds image files to loop devices ("losetup --direct-io=on",
// unless the volume's MutableParamDirectIO says "false") and identifies a
// device by its backing file, read from sysfs.
type transport struct {
	store *filestore.Store
	loops blockdev.LoopDevices
}

var _ backend.Transport = (*transport)(nil)

// Map implements backend.Transport.
func (t *transport) Map(ctx context.Context, req backend.MapRequest) (string, error) {
	return t.loops.Attach(ctx, t.store.ImagePath(req.Image.ID), req.ReadOnly, directIO(req.Image))
}

// Mapped implements backend.Transport: the devices bound to the image file,
// and those still bound to an unlinked file of its name (stale). A device
// with autoclear armed goes away at its last close and loopN may then be
// bound to another image: it is never handed out again.
func (t *transport) Mapped(ctx context.Context, imageID string) ([]backend.MappedDevice, error) {
	devs, err := t.loops.BoundTo(ctx, t.store.ImagePath(imageID))
	if err != nil {
		return nil, err
	}
	out := make([]backend.MappedDevice, 0, len(devs))
	for _, d := range devs {
		out = append(out, backend.MappedDevice{Path: d.Path, ReadOnly: d.ReadOnly, Stale: d.Deleted, NotReusable: d.AutoClear})
	}
	return out, nil
}

// Unmap implements backend.Transport. A device is reported released only
// once the kernel has unbound it.
func (t *transport) Unmap(ctx context.Context, imageID, devicePath string) error {
	d, err := t.loops.Get(ctx, devicePath)
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return nil
	}
	if err != nil {
		return err
	}
	if err := t.loops.Detach(ctx, devicePath); err != nil {
		return err
	}
	return t.awaitRelease(ctx, imageID, *d)
}

// Bounds of awaitRelease: long enough for a udev probe that opened the
// device for a moment, short enough to answer an RPC.
const (
	releaseWait = time.Second
	releasePoll = 20 * time.Millisecond
)

// awaitRelease checks that a detached device really is unbound. The kernel
// defers the detach of a device that somebody holds open (InUse only sees
// exclusive holders) and losetup still succeeds; reporting success then
// would let the volume move to another node while this one can still write
// it. A hold that outlasts releaseWait is a precondition failure, so the
// caller retries; the device is released at the holder's last close.
func (t *transport) awaitRelease(ctx context.Context, imageID string, d blockdev.LoopDevice) error {
	deadline := time.Now().Add(releaseWait)
	for {
		cur, err := t.loops.Get(ctx, d.Path)
		if errdefs.KindOf(err) == errdefs.ErrNotFound {
			return nil
		}
		if err != nil {
			return err
		}
		if cur.BackingFile != d.BackingFile {
			return nil // released, and already bound again to something else
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return errdefs.Precondition("loop device %s of volume %s is still held open by a process; it will be released when that process closes it", d.Path, imageID)
		}
		select {
		case <-ctx.Done():
		case <-time.After(releasePoll):
		}
	}
}

// Identify implements backend.Transport: the device's backing file must be
// the image (an unlinked file of its name makes it stale), also when it was
// bound by a node plugin container that has since restarted.
func (t *transport) Identify(ctx context.Context, imageID, devicePath string) (*backend.MappedDevice, error) {
	path := t.store.ImagePath(imageID)
	d, err := t.loops.Get(ctx, devicePath)
	// An error of no kind (losetup timed out) is that error, not a device.
	if kind := errdefs.KindOf(err); kind == errdefs.ErrNotFound || kind == errdefs.ErrInvalidArgument {
		return nil, errdefs.NotFound("%s is not a loop device of volume %s", devicePath, imageID)
	} else if err != nil {
		return nil, err
	}
	if ok, err := t.loops.Resolve(d, path); err != nil {
		return nil, err
	} else if !ok {
		return nil, errdefs.NotFound("%s is bound to %q, not to volume %s", devicePath, d.BackingFile, imageID)
	}
	return &backend.MappedDevice{Path: d.Path, ReadOnly: d.ReadOnly, Stale: d.Deleted, NotReusable: d.AutoClear}, nil
}

// Refresh implements backend.Transport: the loop driver re-reads the
// backing file's size ("losetup --set-capacity").
func (t *transport) Refresh(ctx context.Context, _, devicePath string) (int64, error) {
	if err := t.loops.SetCapacity(ctx, devicePath); err != nil {
		return 0, err
	}
	return t.loops.Size(devicePath)
}

// Available implements backend.Transport: this node has a loop driver.
func (t *transport) Available(context.Context) error { return t.loops.Available() }

// AttachedDevices implements backend.DeviceLister: every loop device bound
// to an image file of this pool, sorted by device.
func (a attacher) AttachedDevices(ctx context.Context) ([]backend.AttachedDevice, error) {
	devs, err := a.t.loops.BoundUnder(ctx, a.t.store.Dir())
	if err != nil {
		return nil, err
	}
	var out []backend.AttachedDevice
	for _, d := range devs {
		id, ok := a.t.store.ImageIDOf(d.BackingFile)
		if !ok {
			continue // a snapshot or a temporary file, not a volume's image
		}
		out = append(out, backend.AttachedDevice{ImageID: id, Device: backend.Device{Path: d.Path, ReadOnly: d.ReadOnly}, ImageDeleted: d.Deleted})
	}
	return out, nil
}

// CheckImage implements backend.ImageChecker: the image file the node's
// devices are bound to is still in the pool.
func (a attacher) CheckImage(ctx context.Context, imageID string) error {
	return a.t.store.CheckImage(ctx, imageID)
}
