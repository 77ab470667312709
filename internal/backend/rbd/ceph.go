package rbd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// The CSI secret keys that carry cephx credentials, as ceph-csi names them:
// the user without its "client." prefix, and its base64 key. ceph-csi's
// provisioner secrets once named them adminID and adminKey (CephFS still
// does); a request that carries no userID takes those.
const (
	SecretUserID   = "userID"
	SecretUserKey  = "userKey"
	SecretAdminID  = "adminID"
	SecretAdminKey = "adminKey"
)

// callTimeout bounds each program the node runs against the cluster
// inside an RPC (rbd device map, rbd-nbd, qemu-storage-daemon's start),
// as ceph.DefaultCallLimit bounds each library call.
const callTimeout = ceph.DefaultCallLimit

// backgroundCallTimeout bounds one call of background work that the cluster
// cannot run itself (a flatten or a removal where the mgr's rbd_support
// module is missing): long enough for any image, short enough that a hung
// client is eventually given up and the work redone.
const backgroundCallTimeout = 12 * time.Hour

// cluster reaches the instance's clusters: through the Ceph client
// library (internal/ceph: one connection per cluster and identity, shared
// by every call) for everything the store asks, and through the node's
// programs for what maps an image (rbd device map, rbd-nbd,
// qemu-storage-daemon), which need the kernel or serve the device.
type cluster struct {
	cfg    Config
	dialer ceph.Dialer
	run    *command.Runner
	// keyRoot is the parent of the per-call key directories the node's
	// programs read their key from ("" = os.TempDir()).
	keyRoot string
	// callLimit replaces the library's per-call limit, and programLimit
	// callTimeout, when set (tests).
	callLimit, programLimit time.Duration
	// slots holds one token per node program starting a Ceph client
	// (Config.MaxConcurrentCalls).
	slots chan struct{}
	// readKeyFile reads the instance's own key file (os.ReadFile; tests
	// stand in for a node's file).
	readKeyFile func(string) ([]byte, error)
}

// acquireSlot waits, within ctx, until fewer than MaxConcurrentCalls of
// the node's Ceph programs of this instance start, and returns the
// function that gives the slot back. Each spends its first seconds
// starting up (config, monitor session, cephx) on the CPU; on a small
// node several stages at once made every one slow enough to pass the
// per-call limit together, and their retries did it again. A call's own
// limit starts once it has a slot; the time waiting for one counts
// against the request's deadline only.
func (c *cluster) acquireSlot(ctx context.Context) (func(), error) {
	if c.slots == nil {
		return func() {}, nil
	}
	select {
	case c.slots <- struct{}{}:
		return func() { <-c.slots }, nil
	default:
	}
	select {
	case c.slots <- struct{}{}:
		return func() { <-c.slots }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waited until the request's deadline for one of the %d Ceph client slots of this driver (the rbd backend's maxConcurrentCalls), all taken by other calls: %w", cap(c.slots), ctx.Err())
	}
}

// Prefixes of the private temporary directories calls make under keyRoot:
// one for a call's cephx key, one for a node-registry read.
const (
	keyDirPrefix  = "spindle-rbd-key-"
	nodeDirPrefix = "spindle-rbd-node-"
)

// staleKeyDirAge is how old such a directory must be to be the leftover of
// a process killed in the middle of a call: a call lasts at most
// callTimeout (rbd-fuse reads its key file when it starts, within it).
const staleKeyDirAge = 10 * callTimeout

// removeStaleKeyDirs removes the key and node-registry directories under
// root (os.TempDir() when empty) that a killed driver left: a cephx key
// must not outlive its call on the node's disk. Directories of calls that
// may still run, in this process or another driver on the machine, are
// younger than staleKeyDirAge and stay. It returns what it removed.
func removeStaleKeyDirs(root string, now time.Time) []string {
	if root == "" {
		root = os.TempDir()
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var removed []string
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || (!strings.HasPrefix(name, keyDirPrefix) && !strings.HasPrefix(name, nodeDirPrefix)) {
			continue
		}
		info, err := e.Info()
		if err != nil || now.Sub(info.ModTime()) < staleKeyDirAge {
			continue
		}
		if os.RemoveAll(filepath.Join(root, name)) == nil {
			removed = append(removed, filepath.Join(root, name))
		}
	}
	return removed
}

// identity is who a call reaches a cluster as: a cephx user and its key,
// or (fromConfig) whatever the instance's config file names.
type identity struct {
	user       string
	key        string
	keyFile    string // the file key came from (the instance's own), "" for a key from secrets
	fromConfig bool
}

// identityFor picks the request's secrets for a call to cluster id, or
// else, for the instance's own cluster only, its own identity: that
// identity belongs to the own cluster, and a cluster of the map is
// reached with the request's secrets or not at all (as ceph-csi does). A
// request marked backend.WithSecretsOnly never gets the own identity.
// A key never appears in argv, an environment, a log line or an error.
func (c *cluster) identityFor(ctx context.Context, id string) (identity, error) {
	s := backend.SecretsFrom(ctx)
	idKey, keyKey := SecretUserID, SecretUserKey
	if s[SecretUserID] == "" && s[SecretUserKey] == "" && (s[SecretAdminID] != "" || s[SecretAdminKey] != "") {
		idKey, keyKey = SecretAdminID, SecretAdminKey
	}
	user, key := s[idKey], s[keyKey]
	switch {
	case user != "" && key != "":
		if !userIDRe.MatchString(user) {
			return identity{}, errdefs.InvalidArgument("CSI secret %s is not a cephx user name (without the \"client.\" prefix)", idKey)
		}
		return identity{user: user, key: strings.TrimSpace(key)}, nil
	case user != "" || key != "":
		return identity{}, errdefs.InvalidArgument("CSI secrets name %s without %s: both are needed", presentKey(s, idKey, keyKey), missingKey(s, idKey, keyKey))
	case backend.SecretsOnly(ctx):
		return identity{}, errdefs.InvalidArgument("the request's secrets name no cephx identity: %s and %s (or %s and %s) are needed", SecretUserID, SecretUserKey, SecretAdminID, SecretAdminKey)
	case id != c.cfg.ClusterID:
		return identity{}, errdefs.Precondition("no cephx credentials for cluster %s: the request carries no CSI secrets %s and %s, and this backend's own identity is for its own cluster %s only (name the secrets in the StorageClass, or on the PersistentVolume of a static volume)", id, SecretUserID, SecretUserKey, c.cfg.ClusterID)
	case c.cfg.UserID != "":
		return identity{user: c.cfg.UserID, keyFile: c.cfg.KeyFile}, nil
	case c.cfg.ConfigFile != "":
		// The config file's own keyring, if it names one.
		return identity{fromConfig: true}, nil
	}
	return identity{}, errdefs.Precondition("no cephx credentials for %s: the request carries no CSI secrets %s and %s, and the backend config names no userID and keyFile", c.cfg.Pool, SecretUserID, SecretUserKey)
}

// keyValue is the identity's key: the secret's, or read from the
// instance's key file now, so that a rotated Secret is used at once.
func (c *cluster) keyValue(who identity) (string, error) {
	if who.key != "" || who.keyFile == "" {
		return who.key, nil
	}
	read := c.readKeyFile
	if read == nil {
		read = os.ReadFile
	}
	b, err := read(who.keyFile)
	if err != nil {
		return "", errdefs.Wrap(errdefs.ErrUnavailable, err, "read the key of this backend's own cephx user %s (keyFile)", who.user)
	}
	return strings.TrimSpace(string(b)), nil
}

// client is the Ceph client of cluster id as the request's identity.
func (c *cluster) client(ctx context.Context, id string) (ceph.Client, error) {
	return c.clientWithin(ctx, id, c.callLimit)
}

// backgroundClient is the same, for background work (backgroundCallTimeout).
func (c *cluster) backgroundClient(ctx context.Context, id string) (ceph.Client, error) {
	return c.clientWithin(ctx, id, backgroundCallTimeout)
}

func (c *cluster) clientWithin(ctx context.Context, id string, limit time.Duration) (ceph.Client, error) {
	ep, err := c.endpointOf(id)
	if err != nil {
		return nil, err
	}
	who, err := c.identityFor(ctx, id)
	if err != nil {
		return nil, err
	}
	key, err := c.keyValue(who)
	if err != nil {
		return nil, err
	}
	return c.dialer.Dial(ctx, ceph.Target{Monitors: ep.monitors, ConfigFile: c.cfg.ConfigFile, User: who.user, Key: key, CallLimit: limit})
}

// credentials is one node program's cephx identity: the user and a file
// holding the key. cleanup removes what was written.
type credentials struct {
	user    string
	keyFile string
	cleanup func()
}

// credentialsFor is identityFor for a program the node runs: a key from
// the secrets is written to a 0600 file in a fresh 0700 directory, named
// on the command line with --keyfile and removed when the call ends.
func (c *cluster) credentialsFor(ctx context.Context, id string) (*credentials, error) {
	who, err := c.identityFor(ctx, id)
	switch {
	case err != nil:
		return nil, err
	case who.fromConfig:
		return &credentials{cleanup: func() {}}, nil
	case who.keyFile != "":
		return &credentials{user: who.user, keyFile: who.keyFile, cleanup: func() {}}, nil
	}
	dir, err := os.MkdirTemp(c.keyRoot, keyDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("create a private directory for the cephx key: %w", err)
	}
	file := filepath.Join(dir, "key")
	if err := os.WriteFile(file, []byte(who.key), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("write the cephx key file: %w", err)
	}
	return &credentials{user: who.user, keyFile: file, cleanup: func() { _ = os.RemoveAll(dir) }}, nil
}

func presentKey(s backend.Secrets, idKey, keyKey string) string {
	if s[idKey] != "" {
		return idKey
	}
	return keyKey
}

func missingKey(s backend.Secrets, idKey, keyKey string) string {
	if s[idKey] == "" {
		return idKey
	}
	return keyKey
}

// connArgs are the arguments that point a node program at the cluster
// as cred: its monitors as they are now (endpointOf reads the cluster map
// again).
func (c *cluster) connArgs(cred *credentials, ep endpoint) []string {
	conf := c.cfg.ConfigFile
	if conf == "" {
		conf = "/dev/null"
	}
	args := []string{"-c", conf}
	if len(ep.monitors) > 0 {
		args = append(args, "-m", strings.Join(ep.monitors, ","))
	}
	if cred.user != "" {
		args = append(args, "--id", cred.user, "--keyfile", cred.keyFile)
	}
	return args
}

// program runs a node program of cluster id (rbd device map; rbd-nbd map
// through the daemons' runner) with the connection arguments, for at most
// callTimeout, once it has a client slot. A program stopped by that limit
// is reported as the driver's own deadline, and one stopped by the
// caller's context (the RPC's deadline, a cancel) as the caller's:
// neither is the cluster refusing anything.
func (c *cluster) program(ctx context.Context, run *command.Runner, id, name string, args ...string) ([]byte, error) {
	release, err := c.acquireSlot(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	ep, err := c.endpointOf(id)
	if err != nil {
		return nil, err
	}
	cred, err := c.credentialsFor(ctx, id)
	if err != nil {
		return nil, err
	}
	defer cred.cleanup()
	limit := callTimeout
	if c.programLimit > 0 {
		limit = c.programLimit
	}
	callCtx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	out, err := run.Run(callCtx, name, append(args, c.connArgs(cred, ep)...)...)
	if err != nil && command.ExitCode(err) == -1 && callCtx.Err() != nil {
		if ctx.Err() != nil {
			return out, fmt.Errorf("stopped by the request's own deadline or cancellation: %w", err)
		}
		return out, &ceph.DeadlineError{Op: name + " " + strings.Join(args, " "), Limit: limit}
	}
	return out, classify(err)
}

// classify gives a node program's failure its errdefs kind from its exit
// status (the negated errno of the failure). The message keeps the
// command line (no secret is ever on it) and stderr.
func classify(err error) error {
	if err == nil || errdefs.KindOf(err) != nil {
		return err
	}
	switch command.ExitCode(err) {
	case ceph.ENOENT:
		return errdefs.Wrap(errdefs.ErrNotFound, err, "not found")
	case ceph.EEXIST:
		return errdefs.Wrap(errdefs.ErrAlreadyExists, err, "already exists")
	case ceph.ENOSPC, ceph.EDQUOT:
		return errdefs.Wrap(errdefs.ErrExhausted, err, "the pool is full or over its quota")
	}
	return err
}
