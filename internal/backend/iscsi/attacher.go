package iscsi

import (
	"context"
	"strconv"
	"strings"

	"github.com/spindle-csi/spindle/internal/backend"
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
func (n naming) session(ctx context.Context, imageID, nodeID string, pc map[string]string) (session, error) {
	initiator, err := InitiatorIQN(n.cfg.InitiatorPrefix, nodeID)
	if err != nil {
		return session{}, err
	}
	s := session{
		ImageID: imageID, IQN: n.iqn(imageID), LUN: LUN, Serial: n.serial(imageID),
		Initiator: initiator, Portals: n.cfg.Portals,
	}
	if v, ok := pc[ContextTargetIQN]; ok && v != s.IQN {
		return session{}, errdefs.Precondition("the controller published target %s but this node derives %s for volume %s: controller and node configurations disagree", v, s.IQN, imageID)
	}
	if v, ok := pc[ContextSerial]; ok && v != s.Serial {
		return session{}, errdefs.Precondition("the controller published LUN serial %s but this node derives %s for volume %s: controller and node configurations disagree", v, s.Serial, imageID)
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

// source is what the node knows of a volume: the publish_context and the
// CHAP secret, never the pool (which the target host keeps). The
// publish_context is the controller's grant (backend.ContextGrants), and
// the target enforces it: its ACL admits only the initiators of the nodes
// the volume is published to.
type source struct {
	naming
	nodes *nodeRegistry
}

var (
	_ backend.AttachSource  = source{}
	_ backend.ContextGrants = source{}
)

// Grant implements backend.ContextGrants: the publish_context must name a
// target and, when the controller said, this node's initiator; it says
// whether the node may format the volume (formatted.go).
func (s source) Grant(_ context.Context, req backend.AttachRequest) (*backend.Image, *backend.Attachment, error) {
	pc := req.PublishContext
	if pc[ContextTargetIQN] == "" {
		return nil, nil, errdefs.Precondition("volume %s is not published to node %q: its publish_context names no target (ControllerPublishVolume has not granted this node access)", req.ImageID, req.NodeID)
	}
	initiator, err := InitiatorIQN(s.cfg.InitiatorPrefix, req.NodeID)
	if err != nil {
		return nil, nil, err
	}
	if v, ok := pc[ContextInitiator]; ok && v != initiator {
		return nil, nil, errdefs.Precondition("volume %s is published to initiator %s, not to node %q (%s)", req.ImageID, v, req.NodeID, initiator)
	}
	readOnly, err := contextBool(pc, backend.ContextReadOnly, false)
	if err != nil {
		return nil, nil, err
	}
	// A publish_context of an older controller says nothing: never format.
	formatted, err := contextBool(pc, ContextFormatted, true)
	if err != nil {
		return nil, nil, err
	}
	access := backend.AccessType(pc[ContextAccessType])
	switch access {
	case "", backend.AccessMount, backend.AccessBlock:
	default:
		return nil, nil, errdefs.InvalidArgument("publish_context %s=%q is neither %s nor %s", ContextAccessType, access, backend.AccessMount, backend.AccessBlock)
	}
	img := &backend.Image{ID: req.ImageID, Formatted: formatted, FsType: pc[ContextFsType], AccessType: access}
	return img, &backend.Attachment{NodeID: req.NodeID, ReadOnly: readOnly}, nil
}

// contextBool reads a "true"/"false" key of the publish_context; def when
// it is absent.
func contextBool(pc map[string]string, key string, def bool) (bool, error) {
	v, ok := pc[key]
	if !ok {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.InvalidArgument("publish_context %s=%q is not true or false", key, v)
	}
	return b, nil
}

// Get implements backend.AttachSource. The node has no pool to read:
// TransportAttacher asks Grant instead.
func (s source) Get(_ context.Context, imageID string) (*backend.Image, error) {
	return nil, errdefs.Precondition("an iSCSI node reads no pool; volume %s is known to it only through its publish_context", imageID)
}

// CheckAttach: the publish_context must name the target this node derives,
// and make a login (portals, CHAP).
func (s source) CheckAttach(ctx context.Context, img *backend.Image, req backend.AttachRequest) error {
	_, err := s.session(ctx, img.ID, req.NodeID, req.PublishContext)
	return err
}

// RecordFormatted records nothing: the filesystem the node made is the
// record, and the controller copies it into the pool at the volume's next
// publish (formatted.go).
func (s source) RecordFormatted(context.Context, string, string) error { return nil }

// RegisterNode: the node's ID must make an initiator name. The node is
// known to a controller in this process only (nodeRegistry); nothing is
// written anywhere.
func (s source) RegisterNode(_ context.Context, info backend.NodeInfo) error {
	if _, err := InitiatorIQN(s.cfg.InitiatorPrefix, info.NodeID); err != nil {
		return err
	}
	s.nodes.register(info)
	return nil
}

// Probe: the node needs no store; the transport says whether it can log in.
func (s source) Probe(context.Context) error { return nil }

// transport logs in to a volume's target with the connector of the
// configured mode and hands out the LUN's devices.
type transport struct {
	naming
	conn connector
}

var _ backend.SessionTransport = (*transport)(nil)

func mappedOf(d connDevice) backend.MappedDevice {
	return backend.MappedDevice{Path: d.Path, ReadOnly: d.ReadOnly}
}

// Map implements backend.Transport.
func (t *transport) Map(ctx context.Context, req backend.MapRequest) (string, error) {
	s, err := t.session(ctx, req.Image.ID, req.NodeID, req.PublishContext)
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

// Refresh implements backend.Transport: the device takes the LUN's size as
// the target reports it now.
func (t *transport) Refresh(ctx context.Context, imageID, devicePath string) (int64, error) {
	s := session{ImageID: imageID, IQN: t.iqn(imageID), LUN: LUN, Serial: t.serial(imageID), Portals: t.cfg.Portals}
	return t.conn.Refresh(ctx, s, devicePath)
}

// Available implements backend.Transport.
func (t *transport) Available(ctx context.Context) error { return t.conn.Probe(ctx) }
