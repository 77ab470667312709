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
	// Disconnect releases dev, a device of the target's LUN.
	Disconnect(ctx context.Context, iqn, serial, dev string) error
	// Release ends this node's session with the target once none of its
	// devices is left (logout; the daemon stops).
	Release(ctx context.Context, iqn string) error
	// Devices lists the target's devices on this node.
	Devices(ctx context.Context, iqn, serial string) ([]connDevice, error)
	// Identify proves dev is a device of the target's LUN, or ErrNotFound.
	Identify(ctx context.Context, iqn, serial, dev string) (*connDevice, error)
	// Refresh makes dev see the LUN's current size and returns it.
	Refresh(ctx context.Context, s session, dev string) (int64, error)
	// Probe reports whether this node can log in at all.
	Probe(ctx context.Context) error
}

// naming derives, on the controller and on the node alike, what a volume's
// target is called.
type naming struct {
	cfg      Config
	instance string
}

func (n naming) iqn(imageID string) string {
	return TargetIQN(n.cfg.TargetPrefix, n.instance, imageID)
}

func (n naming) serial(imageID string) string { return Serial(n.instance, imageID) }

// session builds the login from the publish_context, checking that it
// names what this node derives for the image.
func (n naming) session(ctx context.Context, img *backend.Image, nodeID string, pc map[string]string) (session, error) {
	initiator, err := InitiatorIQN(n.cfg.InitiatorPrefix, nodeID)
	if err != nil {
		return session{}, err
	}
	s := session{
		ImageID: img.ID, IQN: n.iqn(img.ID), LUN: LUN, Serial: n.serial(img.ID),
		Initiator: initiator, Portals: n.cfg.Portals, SizeBytes: img.CapacityBytes,
	}
	if v, ok := pc[ContextTargetIQN]; ok && v != s.IQN {
		return session{}, errdefs.Precondition("the controller published target %s but this node derives %s for volume %s: controller and node configurations disagree", v, s.IQN, img.ID)
	}
	if v, ok := pc[ContextSerial]; ok && v != s.Serial {
		return session{}, errdefs.Precondition("the controller published LUN serial %s but this node derives %s for volume %s: controller and node configurations disagree", v, s.Serial, img.ID)
	}
	if v, ok := pc[ContextLUN]; ok {
		l, err := strconv.Atoi(v)
		if err != nil || l < 0 {
			return session{}, errdefs.InvalidArgument("publish_context %s=%q is not a LUN number", ContextLUN, v)
		}
		s.LUN = l
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

// source is the pool as the node reads it.
type source struct {
	*filestore.Store
	naming
}

// CheckAttach: the publish_context must name the target this node derives,
// and make a login (portals, CHAP).
func (s source) CheckAttach(ctx context.Context, img *backend.Image, req backend.AttachRequest) error {
	_, err := s.session(ctx, img, req.NodeID, req.PublishContext)
	return err
}

// RegisterNode: the node's ID must make an initiator name.
func (s source) RegisterNode(ctx context.Context, info backend.NodeInfo) error {
	if _, err := InitiatorIQN(s.cfg.InitiatorPrefix, info.NodeID); err != nil {
		return err
	}
	return s.Store.RegisterNode(ctx, info)
}

// transport logs in to a volume's target with the connector of the
// configured mode and hands out the LUN's devices.
type transport struct {
	naming
	store *filestore.Store
	conn  connector
}

var _ backend.SessionTransport = (*transport)(nil)

func mappedOf(d connDevice) backend.MappedDevice {
	return backend.MappedDevice{Path: d.Path, ReadOnly: d.ReadOnly}
}

// Map implements backend.Transport.
func (t *transport) Map(ctx context.Context, req backend.MapRequest) (string, error) {
	s, err := t.session(ctx, req.Image, req.NodeID, req.PublishContext)
	if err != nil {
		return "", err
	}
	s.ReadOnly = req.ReadOnly
	d, err := t.conn.Connect(ctx, s)
	if err != nil {
		return "", err
	}
	return d.Path, nil
}

// Unmap implements backend.Transport.
func (t *transport) Unmap(ctx context.Context, imageID, devicePath string) error {
	return t.conn.Disconnect(ctx, t.iqn(imageID), t.serial(imageID), devicePath)
}

// Release implements backend.SessionTransport.
func (t *transport) Release(ctx context.Context, imageID string) error {
	return t.conn.Release(ctx, t.iqn(imageID))
}

// Mapped implements backend.Transport.
func (t *transport) Mapped(ctx context.Context, imageID string) ([]backend.MappedDevice, error) {
	devs, err := t.conn.Devices(ctx, t.iqn(imageID), t.serial(imageID))
	if err != nil {
		return nil, err
	}
	out := make([]backend.MappedDevice, 0, len(devs))
	for _, d := range devs {
		out = append(out, mappedOf(d))
	}
	return out, nil
}

// Identify implements backend.Transport.
func (t *transport) Identify(ctx context.Context, imageID, devicePath string) (*backend.MappedDevice, error) {
	d, err := t.conn.Identify(ctx, t.iqn(imageID), t.serial(imageID), devicePath)
	if err != nil {
		return nil, err
	}
	m := mappedOf(*d)
	return &m, nil
}

// Refresh implements backend.Transport: the userspace initiator resizes
// its view of the LUN to the image's size in the pool.
func (t *transport) Refresh(ctx context.Context, imageID, devicePath string) (int64, error) {
	img, err := t.store.Get(ctx, imageID)
	if err != nil {
		return 0, err
	}
	s := session{ImageID: img.ID, IQN: t.iqn(img.ID), LUN: LUN, Serial: t.serial(img.ID), Portals: t.cfg.Portals, SizeBytes: img.CapacityBytes}
	return t.conn.Refresh(ctx, s, devicePath)
}

// Available implements backend.Transport.
func (t *transport) Available(ctx context.Context) error { return t.conn.Probe(ctx) }

// attacher is backend.TransportAttacher on iSCSI logins, with the health
// check of its image files.
type attacher struct {
	*backend.TransportAttacher
	store *filestore.Store
}

var _ backend.ImageChecker = attacher{}

// CheckImage implements backend.ImageChecker: the image file is still in
// the pool.
func (a attacher) CheckImage(ctx context.Context, imageID string) error {
	return a.store.CheckImage(ctx, imageID)
}
