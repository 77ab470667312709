// Package iscsi is Spindle's iSCSI backend: sparse image files in the target
// host's pool directory (internal/backend/filestore), each exported by an
// iSCSI target of its own, and logged in to on the node.
//
// # Roles
//
//   - Image store: the filestore pool, wrapped so that Delete also removes
//     the volume's target and Expand makes the LUN take the grown size.
//     Only the controller uses it (store.go opens it at the first call).
//   - Export: one target per volume, IQN "<targetPrefix>:<instance>.<image>",
//     LUN 1 backed by the image file with a serial derived from the volume
//     (the node's identity check), and an initiator ACL that lists exactly
//     the initiators of the nodes the volume is published to. The target
//     exists only while the volume is published. Two target tools
//     implement it: tgt (tgtadm, userspace) and LIO (targetcli, kernel).
//   - Attach: the node logs in with the initiator name derived from its node
//     ID, in one of two modes: kernel (iscsiadm, /dev/disk/by-path) or
//     userspace (qemu-storage-daemon's iSCSI client exported through FUSE,
//     then a loop device), for nodes without the iscsi_tcp module. A node
//     shares no storage with the target host: it has the target's portal,
//     the publish_context (the controller's grant, with what the node must
//     know of the image: formatted.go) and the CHAP secret.
//
// # Initiator names
//
// A node's initiator IQN is "<initiatorPrefix>:<nodeID>", derived, never
// configured per node: the controller learns it from the node ID the
// external-attacher passes to ControllerPublishVolume, and the node logs in
// with exactly that name (kernel mode: an iscsiadm iface with
// iface.initiatorname set; userspace mode: qemu's initiator-name). So the
// ACL needs no registry of nodes, and there is none to share: a node
// plugin registers in its own process only (store.go, nodeRegistry).
//
// # CHAP
//
// CHAP credentials come from the CSI secrets of ControllerPublishVolume (the
// target side) and NodeStageVolume (the login), under open-iscsi's key names:
// node.session.auth.username/password (the initiator's credentials) and
// node.session.auth.username_in/password_in (mutual CHAP: the target's). The
// values never reach a log line or an error. What the tools force: tgtadm
// takes an account's password only as an argument ("--password"), so it is
// visible in the target host's process list for the few milliseconds tgtadm
// runs; iscsiadm likewise takes node.session.auth.password with -v. LIO's
// credentials go to targetcli on stdin instead. qemu reads the password from
// a 0600 file that is removed as soon as the daemon has started; qemu's iSCSI
// client has no mutual CHAP, so the userspace attacher refuses it.
//
// # Reconciliation
//
// tgtd keeps its configuration in memory only: after a restart every target
// is gone. The pool metadata is the truth: every Publish (also a repeated
// one) re-applies the volume's whole target (target, LUN, ACL, CHAP), and
// Store.Reconcile, run when a controller starts, rebuilds the target of
// every published volume and removes targets of this instance that belong to
// no published volume. Passwords are never written to the pool, so a volume
// that was published with CHAP (recorded, without the secret, in the pool's
// .iscsi directory) is rebuilt at startup with an empty ACL: nobody can log
// in until the next ControllerPublishVolume brings the credentials back.
// It fails closed rather than serving the LUN without authentication.
package iscsi

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/filestore"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Type is the backend name in volume IDs and in the config.
const Type = "iscsi"

// Keys of the publish_context the controller hands to the node. The
// read-only flag travels as backend.ContextReadOnly.
const (
	ContextPortals   = "portals"   // comma-separated host:port
	ContextTargetIQN = "targetIQN" // the volume's target
	ContextLUN       = "lun"       // the LUN number (always 1)
	ContextSerial    = "serial"    // the LUN's unit serial number (VPD page 0x80)
)

// MutableParamDirectIO is the one mutable (VolumeAttributesClass) parameter
// of the iscsi backend: "true" has tgt open the image file with O_DIRECT
// (bsoflags=direct), bypassing the target host's page cache; "false" (the
// default) goes through it. It takes effect when the volume's target is
// next built, at its first publish after being unpublished everywhere. LIO
// ignores it: its fileio backstores run with write_back=false always.
const MutableParamDirectIO = backend.MutableParamDirectIO

// validateMutable accepts MutableParamDirectIO with "true" or "false" and
// nothing else.
var validateMutable = backend.DirectIOOnly(Type)

// CHAP secret keys, as open-iscsi names them.
const (
	SecretUser           = "node.session.auth.username"
	SecretPassword       = "node.session.auth.password"
	SecretMutualUser     = "node.session.auth.username_in"
	SecretMutualPassword = "node.session.auth.password_in"
)

// LUN is the LUN number of every volume's image (LUN 0 is tgt's controller).
const LUN = 1

// Target tools and attach modes of the config.
const (
	ToolTgt         = "tgt"
	ToolLIO         = "lio"
	ModeKernel      = "kernel"
	ModeUserspace   = "userspace"
	DefaultStateDir = "/run/spindle/iscsi"
)

// Config is one iscsi instance of the config file.
type Config struct {
	// PoolDir is the target host's pool of image files.
	PoolDir             string `json:"poolDir"`
	MaxProvisionedBytes int64  `json:"maxProvisionedBytes,omitempty"`
	// Portals are the target's host:port addresses the nodes log in to.
	Portals []string `json:"portals"`
	// TargetTool is "tgt" (tgtadm, default) or "lio" (targetcli).
	TargetTool string `json:"targetTool,omitempty"`
	// TgtControlSocket is tgtd's control socket (tgtadm's TGT_IPC_SOCKET);
	// empty for tgtd's default.
	TgtControlSocket string `json:"tgtControlSocket,omitempty"`
	// TargetPrefix starts every target IQN, e.g. "iqn.2026-01.dev.spindle".
	TargetPrefix string `json:"targetPrefix"`
	// InitiatorPrefix starts every node's initiator IQN:
	// "<initiatorPrefix>:<nodeID>".
	InitiatorPrefix string `json:"initiatorPrefix"`
	// AttachMode is "kernel" (iscsiadm, default) or "userspace"
	// (qemu-storage-daemon + FUSE + loop).
	AttachMode string `json:"attachMode,omitempty"`
	// StateDir holds the node's attach state (userspace FUSE exports,
	// kernel session counts); DefaultStateDir when empty.
	StateDir string `json:"stateDir,omitempty"`
}

// Validate reports every problem of c, each naming the field.
func (c Config) Validate() []error {
	var errs []error
	if !strings.HasPrefix(c.PoolDir, "/") {
		errs = append(errs, fmt.Errorf("poolDir %q: must be an absolute path", c.PoolDir))
	}
	if c.MaxProvisionedBytes < 0 {
		errs = append(errs, fmt.Errorf("maxProvisionedBytes: must not be negative"))
	}
	if len(c.Portals) == 0 {
		errs = append(errs, fmt.Errorf("portals: at least one host:port is needed"))
	}
	for i, p := range c.Portals {
		if err := validPortal(p); err != nil {
			errs = append(errs, fmt.Errorf("portals[%d] %q: %w", i, p, err))
		}
	}
	switch c.TargetTool {
	case "", ToolTgt, ToolLIO:
	default:
		errs = append(errs, fmt.Errorf("targetTool %q: must be %q or %q", c.TargetTool, ToolTgt, ToolLIO))
	}
	if c.TgtControlSocket != "" && !strings.HasPrefix(c.TgtControlSocket, "/") {
		errs = append(errs, fmt.Errorf("tgtControlSocket %q: must be an absolute path", c.TgtControlSocket))
	}
	if err := validIQNPrefix(c.TargetPrefix); err != nil {
		errs = append(errs, fmt.Errorf("targetPrefix %q: %w", c.TargetPrefix, err))
	}
	if err := validIQNPrefix(c.InitiatorPrefix); err != nil {
		errs = append(errs, fmt.Errorf("initiatorPrefix %q: %w", c.InitiatorPrefix, err))
	}
	switch c.AttachMode {
	case "", ModeKernel, ModeUserspace:
	default:
		errs = append(errs, fmt.Errorf("attachMode %q: must be %q or %q", c.AttachMode, ModeKernel, ModeUserspace))
	}
	if c.StateDir != "" && (!strings.HasPrefix(c.StateDir, "/") || strings.Contains(c.StateDir, ",")) {
		errs = append(errs, fmt.Errorf("stateDir %q: must be an absolute path without ','", c.StateDir))
	}
	return errs
}

func (c Config) withDefaults() Config {
	if c.TargetTool == "" {
		c.TargetTool = ToolTgt
	}
	if c.AttachMode == "" {
		c.AttachMode = ModeKernel
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	return c
}

func validPortal(p string) error {
	host, port, err := net.SplitHostPort(p)
	if err != nil {
		return fmt.Errorf("not host:port: %w", err)
	}
	if host == "" {
		return fmt.Errorf("no host")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

// iqnPrefixRe is "iqn.YYYY-MM.reversed.domain" (RFC 3720 3.2.6.3.1).
var iqnPrefixRe = regexp.MustCompile(`^iqn\.[0-9]{4}-[0-9]{2}\.[a-z0-9]([a-z0-9.-]*[a-z0-9])?$`)

func validIQNPrefix(p string) error {
	if !iqnPrefixRe.MatchString(p) {
		return fmt.Errorf(`must look like "iqn.2026-01.com.example" (lower case, no ':')`)
	}
	return nil
}

// maxIQN is the longest iSCSI name (RFC 3720 3.2.6.1).
const maxIQN = 223

// iqnSafeRe is what may follow the prefix's ':' as it is.
var iqnSafeRe = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]*$`)

// TargetIQN is the target of an image: "<prefix>:<instance>.<image>", the
// image hashed when it holds characters an IQN may not.
func TargetIQN(prefix, instance, imageID string) string {
	name := imageID
	if !iqnSafeRe.MatchString(name) || len(prefix)+len(instance)+len(name)+2 > maxIQN {
		sum := sha256.Sum256([]byte(imageID))
		name = "h-" + hex.EncodeToString(sum[:16])
	}
	return prefix + ":" + instance + "." + name
}

// InitiatorIQN is the initiator name of a node: "<prefix>:<nodeID>".
// Kubernetes node names (DNS subdomains) always fit; anything else is
// refused rather than rewritten, since the node must derive the same name.
func InitiatorIQN(prefix, nodeID string) (string, error) {
	if !iqnSafeRe.MatchString(nodeID) || len(prefix)+1+len(nodeID) > maxIQN {
		return "", errdefs.InvalidArgument("node ID %q cannot be part of an iSCSI initiator name (lower-case letters, digits, '.', '-'; at most %d characters with the prefix)", nodeID, maxIQN)
	}
	return prefix + ":" + nodeID, nil
}

// Serial is the unit serial number of an image's LUN: "spindle" and 24 hex
// digits of a hash of the instance and image, so a node can prove that a
// device is that image and no other (tgt takes at most 36 characters).
func Serial(instance, imageID string) string {
	sum := sha256.Sum256([]byte(instance + "/" + imageID))
	return "spindle" + hex.EncodeToString(sum[:12])
}

// CHAP is the credentials of one export or login; nil means none.
type CHAP struct {
	User, Password             string
	MutualUser, MutualPassword string
}

// Mutual reports whether the target authenticates to the initiator too.
func (c *CHAP) Mutual() bool { return c != nil && c.MutualUser != "" }

// chapFrom reads the CHAP keys of secrets: nil when there are none, and an
// error naming the key (never a value) when they are incomplete.
func chapFrom(secrets backend.Secrets) (*CHAP, error) {
	c := &CHAP{
		User: secrets[SecretUser], Password: secrets[SecretPassword],
		MutualUser: secrets[SecretMutualUser], MutualPassword: secrets[SecretMutualPassword],
	}
	if *c == (CHAP{}) {
		return nil, nil
	}
	pairs := [][2]string{{SecretUser, SecretPassword}, {SecretMutualUser, SecretMutualPassword}}
	for _, p := range pairs {
		if (secrets[p[0]] == "") != (secrets[p[1]] == "") {
			return nil, errdefs.InvalidArgument("CHAP secrets: %s and %s must be given together", p[0], p[1])
		}
	}
	if c.User == "" {
		return nil, errdefs.InvalidArgument("CHAP secrets: mutual CHAP (%s) needs %s too", SecretMutualUser, SecretUser)
	}
	for _, v := range []string{c.User, c.MutualUser} {
		if strings.ContainsAny(v, " \t\n\"'\\") {
			return nil, errdefs.InvalidArgument("CHAP secrets: a user name may not contain blanks, quotes or backslashes")
		}
	}
	for _, v := range []string{c.Password, c.MutualPassword} {
		if strings.ContainsAny(v, "\n\x00") {
			return nil, errdefs.InvalidArgument("CHAP secrets: a password may not contain a newline or NUL")
		}
	}
	return c, nil
}

func init() {
	backend.Register(backend.Kind[Config]{Type: Type, New: New, Validate: func(c Config, where string) []error {
		var errs []error
		for _, err := range c.Validate() {
			errs = append(errs, fmt.Errorf("%s.%w", where, err))
		}
		return errs
	}})
}

// New builds the instance named name. The controller side administers the
// target with cfg.TargetTool; the node side logs in in cfg.AttachMode.
func New(name string, cfg Config, run *command.Runner) (*backend.Instance, error) {
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, errors.Join(errs...), "iscsi instance %s", name)
	}
	cfg = cfg.withDefaults()
	var tool targetTool
	switch cfg.TargetTool {
	case ToolLIO:
		tool = newLIO(run)
	default:
		tool = newTgt(run, cfg.TgtControlSocket)
	}
	var conn connector
	switch cfg.AttachMode {
	case ModeUserspace:
		conn = newUserspace(run, cfg.StateDir)
	default:
		conn = newKernel(run, cfg.StateDir)
	}
	return newInstance(name, cfg, tool, conn, blockdev.NewBlkid(run))
}

func newInstance(name string, cfg Config, tool targetTool, conn connector, probe signatureProber) (*backend.Instance, error) {
	key := Type + "/" + name
	p := &pool{opts: filestore.Options{Dir: cfg.PoolDir, Name: key, MaxProvisionedBytes: cfg.MaxProvisionedBytes, ValidateMutable: validateMutable}}
	t := &targets{pool: p, tool: tool, cfg: cfg, instance: name}
	nodes := &nodeRegistry{}
	store := &Store{pool: p, targets: t, nodes: nodes, probe: probe, key: key}
	names := naming{cfg: cfg, instance: name}
	return &backend.Instance{
		Type:  Type,
		Name:  name,
		Store: store,
		// A LUN of a file image may be written from one node only (no
		// cluster filesystem coordinates writers), and shared across
		// nodes read-only.
		Exporter: exporter{
			GrantExporter: &backend.GrantExporter{
				Backend: Type, Instance: key, OneWriterReason: "a LUN of a file image can be written from one node only",
				Ledger: store, Hooks: t,
			},
			store: store, cfg: cfg,
		},
		Attacher: &backend.TransportAttacher{
			Source:    source{naming: names, nodes: nodes},
			Transport: &transport{naming: names, conn: conn},
		},
		Snapshots: store,
	}, nil
}
