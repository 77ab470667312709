package rbd

import (
	"fmt"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
)

// Type is the backend name in volume IDs and in the config.
const Type = "rbd"

// Mounters: how a node turns an image into a block device.
const (
	// MounterKRBD maps with the kernel's rbd driver ("rbd device map").
	MounterKRBD = "krbd"
	// MounterNBD maps through rbd-nbd and the kernel's nbd driver.
	MounterNBD = "rbd-nbd"
	// MounterFuse exposes the image as a file with rbd-fuse and binds a
	// loop device to it, for nodes with neither kernel module.
	MounterFuse = "rbd-fuse"
)

// Defaults of Config.
const (
	DefaultImageFeatures = "layering"
	DefaultMaxCloneDepth = 4
	// DefaultHardMaxCloneDepth is the parent chain a new clone may have
	// at most (ceph-csi's hard limit); krbd maps at most 16 levels.
	DefaultHardMaxCloneDepth = 8
	// maxParentChain is the deepest chain the limits may allow.
	maxParentChain = 15
	DefaultFuseDir = "/run/spindle/rbd-fuse"
	// DefaultStateDir keeps, per mapped device, what its unmap needs.
	DefaultStateDir = "/run/spindle/rbd"
	// maxConcurrentCallsLimit bounds MaxConcurrentCalls: each call is a
	// process with its own monitor session.
	maxConcurrentCallsLimit = 256
)

// Config is one rbd instance of the config file:
//
//   - type: rbd
//     name: ceph-a
//     rbd:
//     clusterID: ceph-a
//     monitors: ["10.0.0.1:3300", "10.0.0.2:3300"]
//     pool: kube
//     mounter: krbd
type Config struct {
	// ClusterID is the instance's own cluster: the one a StorageClass
	// without ceph-csi's clusterID parameter (or with this one) gets, and
	// the one volume IDs of the short form <pool>/<image> are in.
	ClusterID string `json:"clusterID"`
	// Monitors are the own cluster's monitor addresses ("host:port",
	// "v2:host:port"). At least one, unless ConfigFile names them or the
	// cluster map lists the own cluster (the map then wins).
	Monitors []string `json:"monitors,omitempty"`
	// ClusterMap is ceph-csi's config.json (a JSON list of clusterID,
	// monitors, rbd.radosNamespace): the ConfigMap Rook writes
	// (rook-ceph-csi-config, key csi-cluster-config-json) mounted as a
	// file. It is read again on every call, so moved monitors are used at
	// once; a StorageClass's clusterID may name any cluster it lists.
	ClusterMap string `json:"clusterMap,omitempty"`
	// Pool is where images go when a StorageClass names no pool (ceph-csi's
	// pool parameter), and where the instance keeps its own records (the
	// node registry, the list of pools in use).
	Pool string `json:"pool"`
	// ConfigFile is an optional ceph.conf; without it the rbd CLI reads
	// none (-c /dev/null) and everything comes from here.
	ConfigFile string `json:"configFile,omitempty"`
	// UserID and KeyFile are the controller's own cephx identity, used for
	// the calls that CSI sends without secrets (ListVolumes, GetCapacity,
	// ControllerGetVolume, probes). KeyFile holds the key (e.g. a mounted
	// Kubernetes Secret). Requests that carry the CSI secrets userID and
	// userKey always use those.
	UserID  string `json:"userID,omitempty"`
	KeyFile string `json:"keyFile,omitempty"`
	// ImageFeatures for new images ("layering", the default, is what every
	// krbd since Linux 3.10 maps).
	ImageFeatures string `json:"imageFeatures,omitempty"`
	// Mounter is krbd (the default), rbd-nbd or rbd-fuse.
	Mounter string `json:"mounter,omitempty"`
	// MapOptions are passed to "rbd device map -o" (krbd, rbd-nbd).
	MapOptions string `json:"mapOptions,omitempty"`
	// MaxCloneDepth is the soft limit of a copy-on-write chain (default
	// 4): a new snapshot, restore or clone whose chain of parents is
	// longer is flattened in the background (Ceph's "rbd task add
	// flatten"), and is usable meanwhile.
	MaxCloneDepth int `json:"maxCloneDepth,omitempty"`
	// HardMaxCloneDepth is the hard limit (default 8): a copy whose chain
	// would be longer is refused with ABORTED, creating nothing, until the
	// flatten that shortens it (started then, if none runs) is done.
	HardMaxCloneDepth int `json:"hardMaxCloneDepth,omitempty"`
	// MaxProvisionedBytes caps the total size of the instance's images
	// (0: only the pool's space limits it).
	MaxProvisionedBytes int64 `json:"maxProvisionedBytes,omitempty"`
	// Fencing: when a single-node volume is published read-write to a node
	// while nobody holds it but the image still has watchers (the node that
	// had it was lost and force-detached), blocklist those watchers' client
	// addresses ("ceph osd blocklist add") before handing the volume over.
	// Off by default: without it such a publish succeeds and the new node
	// refuses to map the image until the watchers are gone.
	Fencing bool `json:"fencing,omitempty"`
	// FuseDir is where rbd-fuse mounts live on the node (rbd-fuse mounter).
	FuseDir string `json:"fuseDir,omitempty"`
	// StateDir is where a node keeps, per device it mapped, the unmap
	// options of its volume (ceph-csi's unmapOptions): NodeUnstage carries
	// neither the volume's parameters nor credentials to read them.
	StateDir string `json:"stateDir,omitempty"`
	// NodeRegistry: node plugins register themselves (node ID, attach
	// limit) in the omap of the RADOS object "spindle.nodes" in the pool,
	// with the config's userID + keyFile (NodeGetInfo carries no secrets),
	// and ControllerPublish refuses a node that never registered
	// (NOT_FOUND) and enforces its MaxVolumesPerNode. Without it any valid
	// node ID may be published to.
	NodeRegistry bool `json:"nodeRegistry,omitempty"`
	// MaxConcurrentCalls is how many Ceph clients (rbd, ceph, rbd-nbd map,
	// rbd-fuse start) one driver process runs at once for the instance
	// inside RPCs; more calls wait for a slot within their request's
	// deadline. Default: the number of CPUs, at least 2. Every client
	// spends its first seconds on the CPU, and on a small node several
	// stages at once made them all pass the per-call limit together.
	MaxConcurrentCalls int `json:"maxConcurrentCalls,omitempty"`
}

var (
	poolRe       = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$`)
	clusterIDRe  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
	userIDRe     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
	monitorRe    = regexp.MustCompile(`^(v[12]:)?[A-Za-z0-9.:\[\]-]+(:[0-9]{1,5})?$`)
	mapOptionsRe = regexp.MustCompile(`^[A-Za-z0-9_=,.:-]*$`)
	featuresRe   = regexp.MustCompile(`^[a-z-]+(,[a-z-]+)*$`)
)

// withDefaults returns c with the defaults filled in.
func (c Config) withDefaults() Config {
	if c.ImageFeatures == "" {
		c.ImageFeatures = DefaultImageFeatures
	}
	if c.Mounter == "" {
		c.Mounter = MounterKRBD
	}
	if c.MaxCloneDepth == 0 {
		c.MaxCloneDepth = DefaultMaxCloneDepth
	}
	if c.HardMaxCloneDepth == 0 {
		c.HardMaxCloneDepth = max(DefaultHardMaxCloneDepth, c.MaxCloneDepth+1)
	}
	if c.FuseDir == "" {
		c.FuseDir = DefaultFuseDir
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.MaxConcurrentCalls == 0 {
		c.MaxConcurrentCalls = max(2, runtime.NumCPU())
	}
	return c
}

// Validate reports every problem of the section; where prefixes each
// ("backends[2].rbd").
func (c Config) Validate(where string) []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: %s", where, field, fmt.Sprintf(format, args...)))
	}
	if !clusterIDRe.MatchString(c.ClusterID) {
		bad("clusterID", "%q must be 1-64 letters, digits, '.', '_' or '-'", c.ClusterID)
	}
	if !poolRe.MatchString(c.Pool) {
		bad("pool", "%q is not a pool name (letters, digits, '.', '_', '-')", c.Pool)
	}
	if len(c.Monitors) == 0 && c.ConfigFile == "" && c.ClusterMap == "" {
		bad("monitors", "name at least one monitor (or a configFile or clusterMap that does)")
	}
	if c.ClusterMap != "" && !filepath.IsAbs(c.ClusterMap) {
		bad("clusterMap", "%q must be an absolute path", c.ClusterMap)
	}
	for i, m := range c.Monitors {
		if !monitorRe.MatchString(m) || strings.Contains(m, ",") {
			bad(fmt.Sprintf("monitors[%d]", i), "%q is not a monitor address (host:port or v2:host:port)", m)
		}
	}
	if c.ConfigFile != "" && !filepath.IsAbs(c.ConfigFile) {
		bad("configFile", "%q must be an absolute path", c.ConfigFile)
	}
	if (c.UserID == "") != (c.KeyFile == "") {
		bad("userID", "userID and keyFile go together (got userID %q, keyFile %q)", c.UserID, c.KeyFile)
	}
	if c.UserID != "" && !userIDRe.MatchString(c.UserID) {
		bad("userID", "%q is not a cephx user name (without the \"client.\" prefix)", c.UserID)
	}
	if c.KeyFile != "" && !filepath.IsAbs(c.KeyFile) {
		bad("keyFile", "%q must be an absolute path", c.KeyFile)
	}
	if c.ImageFeatures != "" && !featuresRe.MatchString(c.ImageFeatures) {
		bad("imageFeatures", "%q must be a comma-separated list of features such as layering", c.ImageFeatures)
	}
	switch c.Mounter {
	case "", MounterKRBD, MounterNBD, MounterFuse:
	default:
		bad("mounter", "%q is not one of %s, %s, %s", c.Mounter, MounterKRBD, MounterNBD, MounterFuse)
	}
	if !mapOptionsRe.MatchString(c.MapOptions) {
		bad("mapOptions", "%q may hold only letters, digits and _=,.:-", c.MapOptions)
	}
	if c.MaxConcurrentCalls < 0 || c.MaxConcurrentCalls > maxConcurrentCallsLimit {
		bad("maxConcurrentCalls", "%d must be between 1 and %d (0 means the number of CPUs, at least 2)", c.MaxConcurrentCalls, maxConcurrentCallsLimit)
	}
	if c.MaxCloneDepth < 0 || c.MaxCloneDepth > 14 {
		bad("maxCloneDepth", "%d must be between 1 and 14 (0 means the default %d)", c.MaxCloneDepth, DefaultMaxCloneDepth)
	}
	if soft := c.withDefaults().MaxCloneDepth; c.HardMaxCloneDepth != 0 && (c.HardMaxCloneDepth <= soft || c.HardMaxCloneDepth > maxParentChain) {
		bad("hardMaxCloneDepth", "%d must be above maxCloneDepth (%d) and at most %d (0 means the default %d)", c.HardMaxCloneDepth, soft, maxParentChain, DefaultHardMaxCloneDepth)
	}
	if c.MaxProvisionedBytes < 0 {
		bad("maxProvisionedBytes", "must not be negative")
	}
	if c.NodeRegistry && c.UserID == "" {
		bad("nodeRegistry", "needs userID and keyFile: node plugins register without CSI secrets")
	}
	if c.FuseDir != "" && !filepath.IsAbs(c.FuseDir) {
		bad("fuseDir", "%q must be an absolute path", c.FuseDir)
	}
	if c.StateDir != "" && !filepath.IsAbs(c.StateDir) {
		bad("stateDir", "%q must be an absolute path", c.StateDir)
	}
	return errs
}
