package iscsi

import (
	"context"
	"strconv"
	"strings"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/filestore"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// session is one login: what a connector needs to reach a LUN.
type session struct {
	ImageID   string
	Portals   []string
	IQN       string
	LUN       int
	Serial    string
	Initiator string
	CHAP      *CHAP
	ReadOnly  bool
	// SizeBytes is the image's size in the pool (a userspace refresh
	// resizes the daemon's view to it).
	SizeBytes int64
}

// connDevice is a local block device of a LUN.
type connDevice struct {
	Path     string
	ReadOnly bool
}

// connector is the node's iSCSI initiator: the kernel's (iscsiadm) or a
// userspace one (qemu-storage-daemon + FUSE + loop).
type connector interface {
	// Connect logs in (reusing a session) and returns a device of the LUN
	// with the asked read-only setting, proven to be the LUN of s.Serial.
	Connect(ctx context.Context, s session) (*connDevice, error)
	// Disconnect releases dev (every device of the target when empty),
	// logging out when nothing else uses the session. A device still in use
	// is ErrPrecondition.
	Disconnect(ctx context.Context, iqn, serial, dev string) error
	// Devices lists the target's devices on this node.
	Devices(ctx context.Context, iqn, serial string) ([]connDevice, error)
	// Identify proves dev is a device of the target's LUN, or ErrNotFound.
	Identify(ctx context.Context, iqn, serial, dev string) (*connDevice, error)
	// Refresh makes dev see the LUN's current size and returns it.
	Refresh(ctx context.Context, s session, dev string) (int64, error)
	// Probe reports whether this node can log in at all.
	Probe(ctx context.Context) error
}

// Attacher is the node side: it checks the publish against the pool and
// hands the login to the connector of the configured mode.
type Attacher struct {
	store    *filestore.Store
	cfg      Config
	instance string
	conn     connector
}

var _ backend.Attacher = (*Attacher)(nil)

func (a *Attacher) iqn(imageID string) string {
	return TargetIQN(a.cfg.TargetPrefix, a.instance, imageID)
}

func (a *Attacher) serial(imageID string) string { return Serial(a.instance, imageID) }

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
	s, err := a.session(ctx, img, req)
	if err != nil {
		return nil, err
	}
	s.ReadOnly = req.ReadOnly || att.ReadOnly || att.AccessMode.ReadOnly()
	devs, err := a.conn.Devices(ctx, s.IQN, s.Serial)
	if err != nil {
		return nil, err
	}
	for _, d := range devs {
		if d.ReadOnly == s.ReadOnly {
			return a.device(img, d), nil
		}
	}
	d, err := a.conn.Connect(ctx, s)
	if err != nil {
		return nil, err
	}
	return a.device(img, *d), nil
}

// session builds the login from the publish_context, checking that it
// names what this node derives for the image.
func (a *Attacher) session(ctx context.Context, img *backend.Image, req backend.AttachRequest) (session, error) {
	initiator, err := InitiatorIQN(a.cfg.InitiatorPrefix, req.NodeID)
	if err != nil {
		return session{}, err
	}
	s := session{
		ImageID: img.ID, IQN: a.iqn(img.ID), LUN: LUN, Serial: a.serial(img.ID),
		Initiator: initiator, Portals: a.cfg.Portals, SizeBytes: img.CapacityBytes,
	}
	pc := req.PublishContext
	if v, ok := pc[ContextTargetIQN]; ok && v != s.IQN {
		return session{}, errdefs.Precondition("the controller published target %s but this node derives %s for volume %s: controller and node configurations disagree", v, s.IQN, img.ID)
	}
	if v, ok := pc[ContextSerial]; ok && v != s.Serial {
		return session{}, errdefs.Precondition("the controller published LUN serial %s but this node derives %s for volume %s: controller and node configurations disagree", v, s.Serial, img.ID)
	}
	if v, ok := pc[ContextLUN]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return session{}, errdefs.InvalidArgument("publish_context %s=%q is not a LUN number", ContextLUN, v)
		}
		s.LUN = n
	}
	if v := pc[ContextPortals]; v != "" {
		s.Portals = strings.Split(v, ",")
		for _, p := range s.Portals {
			if err := validPortal(p); err != nil {
				return session{}, errdefs.InvalidArgument("publish_context %s: portal %q: %v", ContextPortals, p, err)
			}
		}
	}
	// NodeStageVolume's secrets: the login's CHAP credentials.
	s.CHAP, err = chapFrom(backend.SecretsFrom(ctx))
	return s, err
}

func (a *Attacher) device(img *backend.Image, d connDevice) *backend.Device {
	return backend.DeviceOf(img, d.Path, d.ReadOnly)
}

// Detach implements backend.Attacher.
func (a *Attacher) Detach(ctx context.Context, imageID, devicePath string) error {
	return a.conn.Disconnect(ctx, a.iqn(imageID), a.serial(imageID), devicePath)
}

// Devices implements backend.Attacher.
func (a *Attacher) Devices(ctx context.Context, imageID string) ([]backend.Device, error) {
	devs, err := a.conn.Devices(ctx, a.iqn(imageID), a.serial(imageID))
	if err != nil {
		return nil, err
	}
	out := make([]backend.Device, 0, len(devs))
	for _, d := range devs {
		out = append(out, backend.Device{Path: d.Path, ReadOnly: d.ReadOnly})
	}
	return out, nil
}

// Identify implements backend.Attacher.
func (a *Attacher) Identify(ctx context.Context, imageID, devicePath string) (*backend.Device, error) {
	d, err := a.conn.Identify(ctx, a.iqn(imageID), a.serial(imageID), devicePath)
	if err != nil {
		return nil, err
	}
	return &backend.Device{Path: d.Path, ReadOnly: d.ReadOnly}, nil
}

// Refresh implements backend.Attacher.
func (a *Attacher) Refresh(ctx context.Context, imageID, devicePath string) (int64, error) {
	img, err := a.store.Get(ctx, imageID)
	if err != nil {
		return 0, err
	}
	if _, err := a.Identify(ctx, imageID, devicePath); err != nil {
		return 0, err
	}
	s := session{ImageID: imageID, IQN: a.iqn(imageID), LUN: LUN, Serial: a.serial(imageID), Portals: a.cfg.Portals, SizeBytes: img.CapacityBytes}
	return a.conn.Refresh(ctx, s, devicePath)
}

// CheckImage reports, for the volume-health RPCs, whether the image file is
// still in the pool.
func (a *Attacher) CheckImage(ctx context.Context, imageID string) error {
	return a.store.CheckImage(ctx, imageID)
}

// RecordFormatted implements backend.Attacher.
func (a *Attacher) RecordFormatted(ctx context.Context, imageID, fsType string) error {
	return a.store.RecordFormatted(ctx, imageID, fsType)
}

// RegisterNode implements backend.Attacher.
func (a *Attacher) RegisterNode(ctx context.Context, info backend.NodeInfo) error {
	if _, err := InitiatorIQN(a.cfg.InitiatorPrefix, info.NodeID); err != nil {
		return err
	}
	return a.store.RegisterNode(ctx, info)
}

// Probe implements backend.Attacher.
func (a *Attacher) Probe(ctx context.Context) error {
	if err := a.store.Probe(ctx); err != nil {
		return err
	}
	return a.conn.Probe(ctx)
}
