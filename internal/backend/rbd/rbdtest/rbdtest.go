// Package rbdtest starts one real, throw-away Ceph cluster per test binary
// (hack/ceph-up.sh: 1 mon, 1 mgr, 1 memstore OSD on 127.0.0.1, ports of
// its own, everything under one temporary directory) and stops it when the
// binary's tests end. Tests that need it call Require, which skips them,
// saying exactly why, when the cluster could not start (Ceph not
// installed, not root, a daemon that did not come up).
//
//	func TestMain(m *testing.M) { os.Exit(rbdtest.Main(m)) }
package rbdtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Pool is the pool every test cluster has.
const Pool = "spindle-test"

// OSDBytes is the size of the test cluster's memstore OSD: room for the
// GiBs of real data the snapshot tests write (memstore holds only what is
// written, in memory), under Ceph's full ratio of 95 %.
const OSDBytes = 6 << 30

// Cluster is the running test cluster.
type Cluster struct {
	Dir     string // everything of the cluster
	Conf    string // its ceph.conf (mon host, admin keyring)
	Monitor string // "127.0.0.1:<msgr2 port>"
	// MonitorV1 is the same monitor's msgr1 address ("v1:127.0.0.1:<port>"):
	// another address of the same Ceph, for the tests that move a monitor.
	// Empty for an EnvCephDir cluster.
	MonitorV1 string
	Pool      string
	User      string // "admin"
	Key       string // client.admin's key, for CSI secrets
	KeyFile   string // a 0600 file holding Key
	HackDir   string // the repository's hack/
	Mounter   string // how the tests map images (EnvMounter)
	external  bool   // EnvCephDir's cluster: not started or stopped here
	StartUp   time.Duration
	stopped   bool
	upOutput  string
}

var (
	current    *Cluster
	skipReason string
)

// Main starts the cluster, runs the tests and stops it.
func Main(m *testing.M) int {
	c, err := start()
	if err != nil {
		skipReason = err.Error()
		fmt.Fprintf(os.Stderr, "rbdtest: Ceph tests will be skipped: %s\n", skipReason)
	} else {
		current = c
		fmt.Fprintf(os.Stderr, "rbdtest: Ceph cluster up in %s (mon %s, dir %s)\n", c.StartUp.Round(time.Millisecond), c.Monitor, c.Dir)
	}
	code := m.Run()
	if c != nil {
		c.stop()
	}
	return code
}

// Require returns the cluster or skips t with the reason it is missing.
func Require(t testing.TB) *Cluster {
	t.Helper()
	if current == nil {
		if skipReason == "" {
			skipReason = "rbdtest.Main did not run (the package's TestMain must call it)"
		}
		t.Skipf("no Ceph cluster: %s", skipReason)
	}
	return current
}

// repoRoot finds the directory holding go.mod above the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func start() (*Cluster, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("not root: the RBD tests map images (run `sudo make test`)")
	}
	mounter, err := mounterFromEnv()
	if err != nil {
		return nil, err
	}
	if err := requireMounter(mounter); err != nil {
		return nil, err
	}
	if dir := os.Getenv(EnvCephDir); dir != "" {
		return external(dir, mounter)
	}
	var missing []string
	for _, p := range []string{"ceph-mon", "ceph-mgr", "ceph-osd", "ceph", "rbd", "ceph-authtool", "monmaptool", "uuidgen"} {
		if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("missing %s: run hack/install-deps.sh (Debian packages ceph-mon ceph-mgr ceph-osd ceph-common rbd-fuse)", strings.Join(missing, ", "))
	}
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "spindle-ceph-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: filepath.Join(dir, "cluster"), Pool: Pool, User: "admin", HackDir: filepath.Join(root, "hack"), Mounter: mounter}
	c.Conf = filepath.Join(c.Dir, "ceph.conf")
	var v2, v1 int
	if v2, err = freePort(); err == nil {
		v1, err = freePort()
	}
	if err != nil {
		return nil, fmt.Errorf("pick monitor ports: %w", err)
	}
	c.Monitor = "127.0.0.1:" + strconv.Itoa(v2)
	c.MonitorV1 = "v1:127.0.0.1:" + strconv.Itoa(v1)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.HackDir, "ceph-up.sh"), c.Dir, c.Pool)
	cmd.Env = append(os.Environ(), "MON_PORT="+strconv.Itoa(v2), "MON_V1_PORT="+strconv.Itoa(v1), "OSD_BYTES="+strconv.FormatInt(OSDBytes, 10), "LC_ALL=C")
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	c.StartUp = time.Since(t0)
	c.upOutput = string(out)
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("hack/ceph-up.sh failed after %s: %v:\n%s", c.StartUp.Round(time.Millisecond), err, tail(string(out), 2000))
	}
	if err := c.stopOnExit(); err != nil {
		c.stop()
		return nil, fmt.Errorf("start the cluster's watchdog: %v", err)
	}
	key, err := exec.CommandContext(ctx, "ceph-authtool", "-p", "-n", "client.admin", filepath.Join(c.Dir, "ceph.client.admin.keyring")).Output()
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("read the admin key: %v", err)
	}
	c.Key = strings.TrimSpace(string(key))
	c.KeyFile = filepath.Join(dir, "admin.key")
	if err := os.WriteFile(c.KeyFile, []byte(c.Key), 0o600); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// stopOnExit starts a watchdog, in a session of its own, that runs
// ceph-down.sh once this test process is gone and the cluster's directory
// is still there: a `go test -timeout` panic skips every cleanup and left
// the mon, mgr and OSD running. It lives as long as the test process, so
// it has no deadline; its output goes nowhere, so go test does not wait
// for it.
func (c *Cluster) stopOnExit() error {
	const script = `while kill -0 "$1" 2>/dev/null; do sleep 2; done; [ -d "$2" ] || exit 0; LC_ALL=C timeout 60 "$3" "$2"; rm -rf "$4"`
	cmd := exec.Command("sh", "-c", script, "rbdtest-watchdog", strconv.Itoa(os.Getpid()), c.Dir, filepath.Join(c.HackDir, "ceph-down.sh"), filepath.Dir(c.Dir))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}

func (c *Cluster) stop() {
	if c.stopped || c.external {
		return
	}
	c.stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(c.HackDir, "ceph-down.sh"), c.Dir).CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "rbdtest: ceph-down.sh: %v: %s\n", err, out)
		return
	}
	_ = os.RemoveAll(filepath.Dir(c.Dir))
}

// Secrets are the CSI secrets for the cluster's admin user.
func (c *Cluster) Secrets() map[string]string {
	return map[string]string{"userID": c.User, "userKey": c.Key}
}

// RBD runs the rbd CLI as admin on the test pool's cluster.
func (c *Cluster) RBD(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "rbd", append(args, "-c", c.Conf)...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("rbd %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Ceph runs the ceph CLI as admin.
func (c *Cluster) Ceph(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ceph", append(args, "-c", c.Conf)...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ceph %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// Listed is one entry of "rbd ls -l".
type Listed struct {
	Image    string `json:"image"`
	Snapshot string `json:"snapshot,omitempty"`
	Size     int64  `json:"size"`
}

// List lists the pool's images and snapshots.
func (c *Cluster) List(ctx context.Context) ([]Listed, error) {
	out, err := c.RBD(ctx, "ls", "-l", "--format", "json", c.Pool)
	if err != nil {
		return nil, err
	}
	var l []Listed
	return l, json.Unmarshal(out, &l)
}

// Artifacts lists every image and snapshot of the pool ("image",
// "image@snap"), for the conformance suite's leftover checks.
func (c *Cluster) Artifacts(ctx context.Context) ([]string, error) {
	l, err := c.List(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range l {
		if e.Snapshot != "" {
			out = append(out, e.Image+"@"+e.Snapshot)
		} else {
			out = append(out, e.Image)
		}
	}
	return out, nil
}

// Wipe removes every image of the pool and its trash, whatever state they
// are in, in passes: each pass breaks locks, unprotects and purges
// snapshots and removes every image and trash entry that no clone hangs
// from any more, so clones go before their parents (nothing is flattened:
// that would copy the data).
func (c *Cluster) Wipe(ctx context.Context) error {
	stuck := 0
	for {
		l, err := c.List(ctx)
		if err != nil {
			return err
		}
		trash, err := c.Trash(ctx)
		if err != nil {
			return err
		}
		var images []string
		for _, e := range l {
			if e.Snapshot == "" {
				images = append(images, e.Image)
			} else {
				_, _ = c.RBD(ctx, "snap", "unprotect", c.Pool+"/"+e.Image+"@"+e.Snapshot)
			}
		}
		if len(images)+len(trash) == 0 {
			return nil
		}
		var errs []error
		for _, img := range images {
			spec := c.Pool + "/" + img
			if out, err := c.RBD(ctx, "lock", "ls", "--format", "json", spec); err == nil {
				var locks []struct{ ID, Locker string }
				_ = json.Unmarshal(out, &locks)
				for _, l := range locks {
					_, _ = c.RBD(ctx, "lock", "rm", spec, l.ID, l.Locker)
				}
			}
			_, _ = c.RBD(ctx, "snap", "purge", spec)
			if _, err := c.RBD(ctx, "rm", spec); err != nil {
				errs = append(errs, err)
			}
		}
		for _, e := range trash {
			if _, err := c.RBD(ctx, "trash", "rm", "--force", c.Pool+"/"+e.ID); err != nil && !strings.Contains(err.Error(), "No such file") {
				errs = append(errs, err)
			}
		}
		if len(errs) < len(images)+len(trash) {
			stuck = 0
			continue
		}
		// No progress: the Ceph manager may be removing a trash entry
		// right now. Give it a few seconds.
		if stuck++; stuck > 10 {
			return errors.Join(errs...)
		}
		time.Sleep(time.Second)
	}
}

// TrashEntry is one entry of "rbd trash ls".
type TrashEntry struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// Trash lists the pool's trash.
func (c *Cluster) Trash(ctx context.Context) ([]TrashEntry, error) {
	out, err := c.RBD(ctx, "trash", "ls", "--format", "json", c.Pool)
	if err != nil {
		return nil, err
	}
	var l []TrashEntry
	return l, json.Unmarshal(out, &l)
}

// Everything lists every image of the pool with all its snapshots, in any
// namespace ("image@snap", "image@<trash>original-name"), and every trash
// entry ("trash:name"): what a pool that Spindle emptied must not hold.
func (c *Cluster) Everything(ctx context.Context) ([]string, error) {
	l, err := c.List(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range l {
		if e.Snapshot != "" {
			continue
		}
		out = append(out, e.Image)
		snaps, err := c.allSnapshots(ctx, "--image", e.Image)
		if err != nil {
			return nil, err
		}
		for _, s := range snaps {
			out = append(out, e.Image+"@"+s)
		}
	}
	trash, err := c.Trash(ctx)
	if err != nil {
		return nil, err
	}
	for _, e := range trash {
		out = append(out, "trash:"+e.Name)
		snaps, err := c.allSnapshots(ctx, "--image-id", e.ID)
		if err != nil {
			return nil, err
		}
		for _, s := range snaps {
			out = append(out, "trash:"+e.Name+"@"+s)
		}
	}
	return out, nil
}

// allSnapshots lists an image's snapshots in every namespace.
func (c *Cluster) allSnapshots(ctx context.Context, which, image string) ([]string, error) {
	out, err := c.RBD(ctx, "snap", "ls", "--all", "--format", "json", "--pool", c.Pool, which, image)
	if err != nil {
		if strings.Contains(err.Error(), "No such file") {
			return nil, nil // removed meanwhile
		}
		return nil, err
	}
	var snaps []struct {
		Name      string `json:"name"`
		Namespace struct {
			Type         string `json:"type"`
			OriginalName string `json:"original_name"`
		} `json:"namespace"`
	}
	if err := json.Unmarshal(out, &snaps); err != nil {
		return nil, err
	}
	var names []string
	for _, s := range snaps {
		switch s.Namespace.Type {
		case "", "user":
			names = append(names, s.Name)
		case "trash":
			names = append(names, "<trash>"+s.Namespace.OriginalName)
		default:
			names = append(names, "<"+s.Namespace.Type+">"+s.Name)
		}
	}
	return names, nil
}

// PoolStored is the pool's "stored" bytes in "ceph df" (user data, before
// replication), as the mgr last heard from the OSD.
func (c *Cluster) PoolStored(ctx context.Context) (int64, error) {
	out, err := c.Ceph(ctx, "df", "--format", "json")
	if err != nil {
		return 0, err
	}
	var df struct {
		Pools []struct {
			Name  string `json:"name"`
			Stats struct {
				Stored int64 `json:"stored"`
			} `json:"stats"`
		} `json:"pools"`
	}
	if err := json.Unmarshal(out, &df); err != nil {
		return 0, fmt.Errorf("ceph df: %w", err)
	}
	for _, p := range df.Pools {
		if p.Name == c.Pool {
			return p.Stats.Stored, nil
		}
	}
	return 0, fmt.Errorf("ceph df does not list pool %s", c.Pool)
}

// AwaitStored polls "ceph df" (the OSD reports its statistics every few
// seconds) until ok accepts the pool's stored bytes, and returns them.
func (c *Cluster) AwaitStored(ctx context.Context, within time.Duration, ok func(int64) bool) (int64, error) {
	deadline := time.Now().Add(within)
	for {
		n, err := c.PoolStored(ctx)
		if err != nil {
			return 0, err
		}
		if ok(n) {
			return n, nil
		}
		if time.Now().After(deadline) {
			return n, fmt.Errorf("pool %s still stores %d bytes after %s", c.Pool, n, within)
		}
		time.Sleep(time.Second)
	}
}

// PoolUsed is "rbd du" of the pool: the bytes its images and their
// snapshots hold, computed by the rbd CLI from the objects themselves.
func (c *Cluster) PoolUsed(ctx context.Context) (int64, error) {
	out, err := c.RBD(ctx, "du", "--format", "json", "--pool", c.Pool)
	if err != nil {
		return 0, err
	}
	var du struct {
		TotalUsedSize int64 `json:"total_used_size"`
	}
	if err := json.Unmarshal(out, &du); err != nil {
		return 0, fmt.Errorf("rbd du: %w", err)
	}
	return du.TotalUsedSize, nil
}

// ReadImage reads n bytes at off of pool/image ("rbd export" of the
// image to a pipe; test images are small).
func (c *Cluster) ReadImage(ctx context.Context, image string, off int64, n int) ([]byte, error) {
	out, err := c.RBD(ctx, "export", c.Pool+"/"+image, "-")
	if err != nil {
		return nil, err
	}
	if off+int64(n) > int64(len(out)) {
		return nil, fmt.Errorf("image %s has %d bytes; cannot read %d at %d", image, len(out), n, off)
	}
	return out[off : off+int64(n)], nil
}

// WriteImage writes data at off of pool/image through a private rbd-fuse
// mount, synced, then unmounted (and waited for, so its watch is gone).
func (c *Cluster) WriteImage(ctx context.Context, image string, off int64, data []byte) error {
	dir, err := os.MkdirTemp("", "spindle-rbdtest-fuse-")
	if err != nil {
		return err
	}
	defer os.Remove(dir)
	cmd := exec.CommandContext(ctx, "rbd-fuse", "-c", c.Conf, "-p", c.Pool, "-r", image, dir)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("rbd-fuse %s: %v: %s", image, err, out)
	}
	werr := func() error {
		f, err := os.OpenFile(filepath.Join(dir, image), os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := f.WriteAt(data, off); err != nil {
			return err
		}
		return f.Sync()
	}()
	if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("umount %s: %v: %s", dir, err, out)
	}
	if werr != nil {
		return werr
	}
	return c.AwaitNoWatchers(ctx, image, 15*time.Second)
}

// AwaitNoWatchers waits until nobody has the image open.
func (c *Cluster) AwaitNoWatchers(ctx context.Context, image string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		out, err := c.RBD(ctx, "status", "--format", "json", c.Pool+"/"+image)
		if err != nil {
			return err
		}
		if bytes.Contains(out, []byte(`"watchers":[]`)) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("image %s still has watchers after %s: %s", image, within, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// DriverConfig is a driver --config with one rbd instance, rbd/ceph-test,
// on the cluster, mapping with the run's mounter (rbd-fuse under fuseDir by default). userID and keyFile
// serve the RPCs that CSI sends without secrets (ListVolumes, GetCapacity,
// ControllerGetVolume, Probe); calls that carry the secrets userID/userKey
// use those.
func (c *Cluster) DriverConfig(fuseDir string) string {
	return fmt.Sprintf(`defaultBackend: rbd/ceph-test
backends:
  - type: rbd
    name: ceph-test
    rbd:
      clusterID: test
      monitors: [%q]
      pool: %s
      userID: %s
      keyFile: %s
      mounter: %s
      fuseDir: %s
      nodeRegistry: true
`, c.Monitor, c.Pool, c.User, c.KeyFile, c.Mounter, fuseDir)
}

// WriteRandom fills the first n bytes of pool/image with data from a
// generator seeded by seed (every 4 MiB object different, so a copy that
// misplaces or drops one cannot match), through a private rbd-fuse mount,
// synced, then unmounted. It returns the SHA-256 of what it wrote.
func (c *Cluster) WriteRandom(ctx context.Context, image string, n int64, seed uint64) (string, error) {
	dir, err := os.MkdirTemp("", "spindle-rbdtest-fuse-")
	if err != nil {
		return "", err
	}
	defer os.Remove(dir)
	cmd := exec.CommandContext(ctx, "rbd-fuse", "-c", c.Conf, "-p", c.Pool, "-r", image, dir)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("rbd-fuse %s: %v: %s", image, err, out)
	}
	sum, werr := func() (string, error) {
		f, err := os.OpenFile(filepath.Join(dir, image), os.O_WRONLY, 0)
		if err != nil {
			return "", err
		}
		defer f.Close()
		h := sha256.New()
		gen := rand.NewChaCha8(seedOf(seed))
		buf := make([]byte, 4<<20)
		for off := int64(0); off < n; off += int64(len(buf)) {
			chunk := buf[:min(int64(len(buf)), n-off)]
			_, _ = gen.Read(chunk)
			if _, err := f.WriteAt(chunk, off); err != nil {
				return "", err
			}
			h.Write(chunk)
		}
		return hex.EncodeToString(h.Sum(nil)), f.Sync()
	}()
	if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
		return "", fmt.Errorf("umount %s: %v: %s", dir, err, out)
	}
	if werr != nil {
		return "", werr
	}
	return sum, c.AwaitNoWatchers(ctx, image, 15*time.Second)
}

func seedOf(seed uint64) [32]byte {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	return s
}

// Checksum is the SHA-256 of the first n bytes of pool/image, read with
// "rbd export" into a pipe (nothing of it is kept in memory).
func (c *Cluster) Checksum(ctx context.Context, image string, n int64) (string, error) {
	cmd := exec.CommandContext(ctx, "rbd", "export", "--no-progress", c.Pool+"/"+image, "-", "-c", c.Conf)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	h := sha256.New()
	_, cerr := io.CopyN(h, out, n)
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return "", fmt.Errorf("rbd export %s: %v: %s", image, err, strings.TrimSpace(stderr.String()))
	}
	if cerr != nil {
		return "", fmt.Errorf("rbd export %s: read %d bytes: %w", image, n, cerr)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
