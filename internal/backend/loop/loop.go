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
	"maps"
	"path/filepath"
	"slices"
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
const MutableParamDirectIO = "directIO"

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
		Attacher:  &Attacher{store: store, loops: loops},
		Snapshots: store,
		NodeLocal: cfg.NodeLocal,
	}, nil
}

// validateMutable accepts MutableParamDirectIO with "true" or "false" and
// nothing else.
func validateMutable(mutable map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(mutable)) {
		v := mutable[k]
		switch k {
		case MutableParamDirectIO:
			if v != "true" && v != "false" {
				return errdefs.InvalidArgument("mutable parameter %s=%q: the value must be \"true\" or \"false\"", k, v)
			}
		default:
			return errdefs.InvalidArgument("mutable parameter %q is not supported by the loop backend (it supports %s)", k, MutableParamDirectIO)
		}
	}
	return nil
}

// directIO says whether the image is to be attached with direct I/O.
func directIO(img *backend.Image) bool {
	return img.MutableParameters[MutableParamDirectIO] != "false"
}

// exportHooks give a loop grant its publish_context: the image's path,
// which the node checks against its own view of the pool.
type exportHooks struct {
	backend.NoExportHooks
	store *filestore.Store
}

func (h exportHooks) PublishContext(img *backend.Image) map[string]string {
	return map[string]string{ContextImagePath: h.store.ImagePath(img.ID)}
}

// Attacher binds images to loop devices on this node.
type Attacher struct {
	store *filestore.Store
	loops blockdev.LoopDevices
}

var _ backend.Attacher = (*Attacher)(nil)

// Attach implements backend.Attacher.
func (a *Attacher) Attach(ctx context.Context, req backend.AttachRequest) (*backend.Device, error) {
	img, err := a.store.Get(ctx, req.ImageID)
	if err != nil {
		return nil, err
	}
	att, err := backend.GrantOf(img, req.NodeID)
	if err != nil {
		return nil, err
	}
	path := a.store.ImagePath(req.ImageID)
	if p, ok := req.PublishContext[ContextImagePath]; ok && p != path {
		return nil, errdefs.Precondition("the controller published image path %s but this node's pool holds it at %s: controller and node configurations disagree", p, path)
	}
	readOnly := req.ReadOnly || att.ReadOnly || att.AccessMode.ReadOnly()

	devs, err := a.devicesOf(ctx, path, false)
	if err != nil {
		return nil, err
	}
	for _, d := range devs {
		// A device with autoclear armed goes away at its last close, and
		// loopN may then be bound to another image: never hand it out again.
		if d.ReadOnly == readOnly && !d.AutoClear {
			return a.device(img, d), nil
		}
	}
	devPath, err := a.loops.Attach(ctx, path, readOnly, directIO(img))
	if err != nil {
		return nil, err
	}
	// Prove the device is bound to our image before anyone formats or mounts it.
	d, err := a.lookup(ctx, devPath)
	if err != nil {
		return nil, err
	}
	if d.BackingFile != path || d.Deleted {
		return nil, errdefs.Precondition("loop device %s is bound to %q, not to image %s; refusing to use it", devPath, d.BackingFile, path)
	}
	if d.ReadOnly != readOnly {
		_ = a.loops.Detach(ctx, devPath)
		return nil, errdefs.Precondition("loop device %s came up with read-only=%t, asked for %t", devPath, d.ReadOnly, readOnly)
	}
	return a.device(img, *d), nil
}

func (a *Attacher) device(img *backend.Image, d blockdev.LoopDevice) *backend.Device {
	return backend.DeviceOf(img, d.Path, d.ReadOnly)
}

func (a *Attacher) lookup(ctx context.Context, devPath string) (*blockdev.LoopDevice, error) {
	return a.loops.Get(ctx, devPath)
}

// devicesOf lists the loop devices bound to path; with deleted, also those
// still bound to an unlinked file of that name.
func (a *Attacher) devicesOf(ctx context.Context, path string, deleted bool) ([]blockdev.LoopDevice, error) {
	all, err := a.loops.BoundTo(ctx, path)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, d := range all {
		if deleted || !d.Deleted {
			out = append(out, d)
		}
	}
	return out, nil
}

// Detach implements backend.Attacher. Only devices whose backing file is the
// image (or an unlinked file of the image's name) are ever detached, and a
// device is reported released only once the kernel has unbound it.
func (a *Attacher) Detach(ctx context.Context, imageID, devicePath string) error {
	devs, err := a.devicesOf(ctx, a.store.ImagePath(imageID), true)
	if err != nil {
		return err
	}
	for _, d := range devs {
		if devicePath != "" && d.Path != devicePath {
			continue
		}
		busy, err := a.loops.InUse(d.Path)
		if err != nil {
			return err
		}
		if busy {
			return errdefs.Precondition("loop device %s of volume %s is still in use (mounted or held open exclusively)", d.Path, imageID)
		}
		if err := a.loops.Detach(ctx, d.Path); err != nil {
			return err
		}
		if err := a.awaitRelease(ctx, imageID, d); err != nil {
			return err
		}
	}
	return nil
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
func (a *Attacher) awaitRelease(ctx context.Context, imageID string, d blockdev.LoopDevice) error {
	deadline := time.Now().Add(releaseWait)
	for {
		cur, err := a.lookup(ctx, d.Path)
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

// Devices implements backend.Attacher.
func (a *Attacher) Devices(ctx context.Context, imageID string) ([]backend.Device, error) {
	devs, err := a.devicesOf(ctx, a.store.ImagePath(imageID), false)
	if err != nil {
		return nil, err
	}
	out := make([]backend.Device, 0, len(devs))
	for _, d := range devs {
		out = append(out, backend.Device{Path: d.Path, ReadOnly: d.ReadOnly})
	}
	return out, nil
}

var _ backend.DeviceLister = (*Attacher)(nil)

// AttachedDevices implements backend.DeviceLister: every loop device bound
// to an image file of this pool, sorted by device.
func (a *Attacher) AttachedDevices(ctx context.Context) ([]backend.AttachedDevice, error) {
	devs, err := a.loops.BoundUnder(ctx, a.store.Dir())
	if err != nil {
		return nil, err
	}
	var out []backend.AttachedDevice
	for _, d := range devs {
		id, ok := a.store.ImageIDOf(d.BackingFile)
		if !ok {
			continue // a snapshot or a temporary file, not a volume's image
		}
		out = append(out, backend.AttachedDevice{ImageID: id, Device: backend.Device{Path: d.Path, ReadOnly: d.ReadOnly}, ImageDeleted: d.Deleted})
	}
	return out, nil
}

// Identify implements backend.Attacher: the device's backing file, read from
// sysfs, must be the image (not an unlinked file of its name).
func (a *Attacher) Identify(ctx context.Context, imageID, devicePath string) (*backend.Device, error) {
	path := a.store.ImagePath(imageID)
	d, err := a.loops.Get(ctx, devicePath)
	switch errdefs.KindOf(err) {
	case nil:
	case errdefs.ErrNotFound, errdefs.ErrInvalidArgument:
		return nil, errdefs.NotFound("%s is not a loop device of volume %s", devicePath, imageID)
	default:
		return nil, err
	}
	if d.BackingFile != path || d.Deleted {
		return nil, errdefs.NotFound("%s is bound to %q, not to volume %s", devicePath, d.BackingFile, imageID)
	}
	return &backend.Device{Path: d.Path, ReadOnly: d.ReadOnly}, nil
}

// Refresh implements backend.Attacher: after proving devicePath is the
// image's, it has the loop driver re-read the backing file's size
// ("losetup --set-capacity") and returns the device's new size.
func (a *Attacher) Refresh(ctx context.Context, imageID, devicePath string) (int64, error) {
	if _, err := a.Identify(ctx, imageID, devicePath); err != nil {
		return 0, err
	}
	if err := a.loops.SetCapacity(ctx, devicePath); err != nil {
		return 0, err
	}
	return a.loops.Size(devicePath)
}

// CheckImage reports, for the volume-health RPCs, whether the image file the
// node's devices are bound to is still in the pool.
func (a *Attacher) CheckImage(ctx context.Context, imageID string) error {
	return a.store.CheckImage(ctx, imageID)
}

// RecordFormatted implements backend.Attacher.
func (a *Attacher) RecordFormatted(ctx context.Context, imageID, fsType string) error {
	return a.store.RecordFormatted(ctx, imageID, fsType)
}

// RegisterNode implements backend.Attacher.
func (a *Attacher) RegisterNode(ctx context.Context, info backend.NodeInfo) error {
	return a.store.RegisterNode(ctx, info)
}

// Probe implements backend.Attacher: the pool is reachable and this node
// has a loop driver.
func (a *Attacher) Probe(ctx context.Context) error {
	if err := a.store.Probe(ctx); err != nil {
		return err
	}
	return a.loops.Available()
}
