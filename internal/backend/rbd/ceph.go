package rbd

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
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

// callTimeout bounds every call to the cluster made inside an RPC. A stale
// lock makes "rbd rm" wait forever, and an unreachable monitor makes every
// client retry for minutes; neither may hang an RPC. Nothing whose length
// grows with the data (a copy, a flatten, removing a large image) runs under
// it: that work is copy-on-write, or handed to the cluster's own background
// tasks (tasks.go).
const callTimeout = 30 * time.Second

// backgroundCallTimeout bounds one call of background work that the cluster
// cannot run itself (a flatten or a removal where the mgr's rbd_support
// module is missing): long enough for any image, short enough that a hung
// client is eventually killed and the work redone.
const backgroundCallTimeout = 12 * time.Hour

// cluster runs the rbd and ceph CLIs against one instance's cluster.
type cluster struct {
	cfg     Config
	run     *command.Runner
	keyRoot string // parent of the per-call key directories ("" = os.TempDir())
	// callLimit replaces callTimeout when set (tests).
	callLimit time.Duration
	// slots holds one token per Ceph client running inside an RPC
	// (Config.MaxConcurrentCalls).
	slots chan struct{}
}

// acquireSlot waits, within ctx, until fewer than MaxConcurrentCalls Ceph
// clients of this instance run, and returns the function that gives the
// slot back. Each client spends its first seconds starting up (config,
// monitor session, cephx) on the CPU; on a small node several stages at
// once made every client slow enough to pass the per-call limit together,
// and their retries did it again. A call's own limit starts once it has a
// slot; the time waiting for one counts against the request's deadline
// only.
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

// credentials is one call's cephx identity: the user and a file holding
// the key. cleanup removes what was written.
type credentials struct {
	user    string
	keyFile string
	cleanup func()
}

// credentialsFor picks the request's secrets for a call to cluster id, or
// else, for the instance's own cluster only, its own identity: that
// identity belongs to the own cluster, and a cluster of the map is
// reached with the request's secrets or not at all (as ceph-csi does). A
// request marked backend.WithSecretsOnly never gets the own identity.
// The key from the secrets is written to a 0600 file in a fresh 0700
// directory, named on the command line with --keyfile and removed when
// the call ends: a key never appears in argv (readable by anyone in ps)
// nor in an environment, a log line or an error.
func (c *cluster) credentialsFor(ctx context.Context, id string) (*credentials, error) {
	s := backend.SecretsFrom(ctx)
	idKey, keyKey := SecretUserID, SecretUserKey
	if s[SecretUserID] == "" && s[SecretUserKey] == "" && (s[SecretAdminID] != "" || s[SecretAdminKey] != "") {
		idKey, keyKey = SecretAdminID, SecretAdminKey
	}
	user, key := s[idKey], s[keyKey]
	switch {
	case user != "" && key != "":
		if !userIDRe.MatchString(user) {
			return nil, errdefs.InvalidArgument("CSI secret %s is not a cephx user name (without the \"client.\" prefix)", idKey)
		}
		dir, err := os.MkdirTemp(c.keyRoot, keyDirPrefix)
		if err != nil {
			return nil, fmt.Errorf("create a private directory for the cephx key: %w", err)
		}
		file := filepath.Join(dir, "key")
		if err := os.WriteFile(file, []byte(key), 0o600); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("write the cephx key file: %w", err)
		}
		return &credentials{user: user, keyFile: file, cleanup: func() { _ = os.RemoveAll(dir) }}, nil
	case user != "" || key != "":
		return nil, errdefs.InvalidArgument("CSI secrets name %s without %s: both are needed", presentKey(s, idKey, keyKey), missingKey(s, idKey, keyKey))
	case backend.SecretsOnly(ctx):
		return nil, errdefs.InvalidArgument("the request's secrets name no cephx identity: %s and %s (or %s and %s) are needed", SecretUserID, SecretUserKey, SecretAdminID, SecretAdminKey)
	case id != c.cfg.ClusterID:
		return nil, errdefs.Precondition("no cephx credentials for cluster %s: the request carries no CSI secrets %s and %s, and this backend's own identity is for its own cluster %s only (name the secrets in the StorageClass, or on the PersistentVolume of a static volume)", id, SecretUserID, SecretUserKey, c.cfg.ClusterID)
	case c.cfg.UserID != "":
		return &credentials{user: c.cfg.UserID, keyFile: c.cfg.KeyFile, cleanup: func() {}}, nil
	case c.cfg.ConfigFile != "":
		// The config file's own keyring, if it names one.
		return &credentials{cleanup: func() {}}, nil
	}
	return nil, errdefs.Precondition("no cephx credentials for %s: the request carries no CSI secrets %s and %s, and the backend config names no userID and keyFile", c.cfg.Pool, SecretUserID, SecretUserKey)
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

// conn is one cluster of the instance as its calls reach it: the
// instance's own, or one of its cluster map (clustermap.go).
type conn struct {
	*cluster
	id string // the cluster ID
}

// on returns the connection to cluster id.
func (c *cluster) on(id string) conn { return conn{cluster: c, id: id} }

// connArgs are the arguments that point a Ceph CLI at the cluster as cred:
// its monitors as they are now (endpointOf reads the cluster map again).
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

// rbd runs "rbd <args> <connection args>" and returns its stdout.
func (k conn) rbd(ctx context.Context, args ...string) ([]byte, error) {
	return k.cli(ctx, "rbd", args...)
}

// ceph runs "ceph <args> <connection args>".
func (k conn) ceph(ctx context.Context, args ...string) ([]byte, error) {
	return k.cli(ctx, "ceph", args...)
}

func (k conn) cli(ctx context.Context, name string, args ...string) ([]byte, error) {
	return k.cliWithin(ctx, k.limit(), name, args...)
}

// limit is the bound on one call inside an RPC.
func (k conn) limit() time.Duration {
	if k.callLimit > 0 {
		return k.callLimit
	}
	return callTimeout
}

// rbdBackground runs rbd for background work, under backgroundCallTimeout
// rather than the per-call deadline.
//
// It takes no client slot (acquireSlot): background work runs for as long
// as the image needs, and would keep RPCs waiting behind it.
func (k conn) rbdBackground(ctx context.Context, args ...string) ([]byte, error) {
	return k.runUngated(ctx, k.run, backgroundCallTimeout, "rbd", args...)
}

// cliWithin runs a Ceph CLI for at most limit (runWithin).
func (k conn) cliWithin(ctx context.Context, limit time.Duration, name string, args ...string) ([]byte, error) {
	return k.runWithin(ctx, k.run, limit, name, args...)
}

// daemon runs a program that leaves a daemon serving an attached volume
// behind (rbd-nbd map), with the connection arguments, under the per-call
// limit, through the daemons' runner: in the attach daemon when the node
// plugin has one.
func (k conn) daemon(ctx context.Context, name string, args ...string) ([]byte, error) {
	return k.runWithin(ctx, k.run.Daemons(), k.limit(), name, args...)
}

// runWithin runs a Ceph program through run, with the connection
// arguments, for at most limit. A call stopped by that limit is reported
// as the driver's own deadline, and one stopped by the caller's context
// (the RPC's deadline, a cancel) as the caller's: neither is the cluster
// refusing anything.
//
// The call first takes one of the instance's client slots (acquireSlot).
func (k conn) runWithin(ctx context.Context, run *command.Runner, limit time.Duration, name string, args ...string) ([]byte, error) {
	release, err := k.acquireSlot(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return k.runUngated(ctx, run, limit, name, args...)
}

// runUngated is runWithin without a client slot.
func (k conn) runUngated(ctx context.Context, run *command.Runner, limit time.Duration, name string, args ...string) ([]byte, error) {
	ep, err := k.endpointOf(k.id)
	if err != nil {
		return nil, err
	}
	cred, err := k.credentialsFor(ctx, k.id)
	if err != nil {
		return nil, err
	}
	defer cred.cleanup()
	callCtx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	out, err := run.Run(callCtx, name, append(args, k.connArgs(cred, ep)...)...)
	if err != nil && command.ExitCode(err) == -1 && callCtx.Err() != nil {
		if ctx.Err() != nil {
			return out, fmt.Errorf("stopped by the request's own deadline or cancellation: %w", err)
		}
		return out, &deadlineError{limit: limit, err: err}
	}
	return out, classify(err)
}

// deadlineError is a call the driver stopped at its own per-call limit.
// It carries no errdefs kind: the driver reports it as DEADLINE_EXCEEDED,
// and says whose deadline it was.
type deadlineError struct {
	limit time.Duration
	err   error
}

func (e *deadlineError) Error() string {
	return fmt.Sprintf("stopped by Spindle's own per-call limit of %s (the rbd backend's bound on one cluster call inside an RPC), not refused by the cluster: %v", e.limit, e.err)
}

func (e *deadlineError) Unwrap() error { return e.err }

// rbdJSON runs rbd with --format json and decodes its output into v.
func (k conn) rbdJSON(ctx context.Context, v any, args ...string) error {
	out, err := k.rbd(ctx, append(args, "--format", "json")...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("rbd %s: cannot parse its JSON output %.200q: %w", strings.Join(args, " "), out, err)
	}
	return nil
}

// Exit statuses of the Ceph CLIs: the negated errno of the failure.
const (
	exitENOENT     = 2
	exitEBUSY      = 16
	exitEEXIST     = 17
	exitEINVAL     = 22
	exitENOSPC     = 28
	exitENOTEMPTY  = 39
	exitEOPNOTSUPP = 95
	exitEDQUOT     = 122
)

// classify gives a CLI failure its errdefs kind. The message keeps the
// command line (no secret is ever on it) and stderr.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if errdefs.KindOf(err) != nil {
		return err
	}
	switch command.ExitCode(err) {
	case exitENOENT:
		return errdefs.Wrap(errdefs.ErrNotFound, err, "not found")
	case exitEEXIST:
		return errdefs.Wrap(errdefs.ErrAlreadyExists, err, "already exists")
	case exitENOSPC, exitEDQUOT:
		return errdefs.Wrap(errdefs.ErrExhausted, err, "the pool is full or over its quota")
	}
	return err
}
