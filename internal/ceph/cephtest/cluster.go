package cephtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spindle-csi/spindle/internal/ceph"
)

// A real, throw-away Ceph cluster for tests: hack/ceph-up.sh (1 mon, 1
// mgr, 1 memstore OSD on 127.0.0.1, ports of its own, everything under one
// temporary directory), started by a test binary that runs inside a Ceph
// root (hack/ceph/run; `make test` runs the Ceph packages so), whose
// daemons, CLIs and client libraries are the release under test.

// Environment that points the tests at a cluster.
const (
	// EnvCephDir names a running cluster to use instead of starting one:
	// the directory holds its ceph.conf and ceph.client.admin.keyring, and
	// it has the pools Pool and OtherPool and Pool's namespace Namespace.
	EnvCephDir = "SPINDLE_CEPH_DIR"
	// EnvCephMon is that cluster's monitor, host:port (msgr2), and
	// EnvCephMonV1 its msgr1 address (v1:host:port), when it has one.
	EnvCephMon   = "SPINDLE_CEPH_MON"
	EnvCephMonV1 = "SPINDLE_CEPH_MON_V1"
)

// The pools and the namespace every test cluster has.
const (
	Pool      = "spindle-test"
	OtherPool = "spindle-test-b"
	Namespace = "ns1"
)

// Cluster is a running test cluster.
type Cluster struct {
	Dir     string // everything of the cluster
	Conf    string // its ceph.conf (mon host, admin keyring)
	Monitor string // "127.0.0.1:<msgr2 port>"
	// MonitorV1 is the same monitor's msgr1 address ("v1:127.0.0.1:<port>"):
	// another address of the same Ceph (EnvCephMonV1's for an EnvCephDir
	// cluster).
	MonitorV1 string
	Pool      string
	User      string // "admin"
	Key       string // client.admin's key, for CSI secrets
	KeyFile   string // a 0600 file holding Key
	HackDir   string // the repository's hack/
	// Release is what the cluster's monitors run, and ClientRelease the
	// root this test runs in (its librados, librbd and CLIs).
	Release       string
	ClientRelease string
	StartUp       time.Duration
	external      bool
	stopped       bool
}

// InCephRoot reports which Ceph root this process runs in ("20 20.2.4"),
// or "" outside one.
func InCephRoot() string {
	b, err := os.ReadFile("/etc/spindle-ceph-root")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Start starts a cluster (or takes EnvCephDir's), with osdBytes of
// memstore. It says why when it cannot.
func Start(osdBytes int64) (*Cluster, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("not root: the Ceph tests start daemons and map images (run `sudo make test`)")
	}
	root := InCephRoot()
	repo, err := repoRoot()
	if err != nil {
		return nil, err
	}
	// A cluster named by EnvCephDir is used with the client this machine
	// has: the qemu guests (hack/vm) test their own kernel's and Debian's
	// client against the cluster the host runs.
	if dir := os.Getenv(EnvCephDir); dir != "" {
		c, err := external(dir)
		if err == nil {
			c.HackDir, c.ClientRelease = filepath.Join(repo, "hack"), root
			if root == "" {
				c.ClientRelease = "this machine's"
			}
			c.Release, err = c.release()
		}
		return c, err
	}
	if root == "" {
		return nil, fmt.Errorf("not inside a Ceph root: the Ceph tests run with the client of the release under test (run them as `make test` does, through hack/ceph/run: go test -exec hack/ceph/run ...)")
	}
	var missing []string
	for _, p := range []string{"ceph-mon", "ceph-mgr", "ceph-osd", "ceph", "rbd", "ceph-authtool", "monmaptool", "uuidgen"} {
		if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("the Ceph root %q lacks %s (rebuild it: hack/ceph/root.sh)", root, strings.Join(missing, ", "))
	}
	dir, err := os.MkdirTemp("", "spindle-ceph-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: filepath.Join(dir, "cluster"), Pool: Pool, User: "admin", HackDir: filepath.Join(repo, "hack"), ClientRelease: root}
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
	cmd := exec.CommandContext(ctx, filepath.Join(c.HackDir, "ceph-up.sh"), c.Dir, Pool, OtherPool)
	cmd.Env = append(os.Environ(), "MON_PORT="+strconv.Itoa(v2), "MON_V1_PORT="+strconv.Itoa(v1), "OSD_BYTES="+strconv.FormatInt(osdBytes, 10), "LC_ALL=C")
	// Every snapshot create and remove waits for a monitor commit, which
	// Ceph gathers for a second by default: the tests take snapshots by
	// the hundred. A caller that measures (the benchmarks) sets
	// MON_PROPOSE_INTERVAL itself, to Ceph's default.
	if os.Getenv("MON_PROPOSE_INTERVAL") == "" {
		cmd.Env = append(cmd.Env, "MON_PROPOSE_INTERVAL=0.05")
	}
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	c.StartUp = time.Since(t0)
	if err != nil {
		c.Stop()
		return nil, fmt.Errorf("hack/ceph-up.sh failed after %s: %v:\n%s", c.StartUp.Round(time.Millisecond), err, tail(string(out), 2000))
	}
	if err := c.stopOnExit(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("start the cluster's watchdog: %v", err)
	}
	key, err := exec.CommandContext(ctx, "ceph-authtool", "-p", "-n", "client.admin", filepath.Join(c.Dir, "ceph.client.admin.keyring")).Output()
	if err != nil {
		c.Stop()
		return nil, fmt.Errorf("read the admin key: %v", err)
	}
	c.Key = strings.TrimSpace(string(key))
	c.KeyFile = filepath.Join(dir, "admin.key")
	if err := os.WriteFile(c.KeyFile, []byte(c.Key), 0o600); err != nil {
		c.Stop()
		return nil, err
	}
	if _, err := c.RBD(ctx, "namespace", "create", Pool+"/"+Namespace); err != nil {
		c.Stop()
		return nil, err
	}
	if c.Release, err = c.release(); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// release is the monitors' release, as "ceph versions" reports it.
func (c *Cluster) release() (string, error) {
	out, err := c.Ceph(context.Background(), "versions", "--format", "json")
	if err != nil {
		return "", err
	}
	var v map[string]map[string]int
	if err := json.Unmarshal(out, &v); err != nil {
		return "", fmt.Errorf("ceph versions: %w", err)
	}
	var mons []string
	for k := range v["mon"] {
		mons = append(mons, k)
	}
	slices.Sort(mons)
	return strings.Join(mons, ", "), nil
}

// external is the running cluster in dir (EnvCephDir).
func external(dir string) (*Cluster, error) {
	mon := os.Getenv(EnvCephMon)
	if mon == "" {
		return nil, fmt.Errorf("%s is set but %s (the monitor's host:port) is not", EnvCephDir, EnvCephMon)
	}
	keyring, err := os.ReadFile(filepath.Join(dir, "ceph.client.admin.keyring"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvCephDir, err)
	}
	// [client.admin]\n\tkey = AQ...==
	var key string
	for _, line := range strings.Split(string(keyring), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && strings.TrimSpace(k) == "key" {
			key = strings.TrimSpace(v)
		}
	}
	if key == "" {
		return nil, fmt.Errorf("%s: no key in ceph.client.admin.keyring", dir)
	}
	keyDir, err := os.MkdirTemp("", "spindle-ceph-key-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, Conf: filepath.Join(dir, "ceph.conf"), Monitor: mon, MonitorV1: os.Getenv(EnvCephMonV1), Pool: Pool, User: "admin",
		Key: key, KeyFile: filepath.Join(keyDir, "admin.key"), external: true}
	if err := os.WriteFile(c.KeyFile, []byte(key), 0o600); err != nil {
		return nil, err
	}
	return c, nil
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
	cmd := exec.Command("sh", "-c", script, "cephtest-watchdog", strconv.Itoa(os.Getpid()), c.Dir, filepath.Join(c.HackDir, "ceph-down.sh"), filepath.Dir(c.Dir))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}

// Stop stops a cluster Start started and removes its directory.
func (c *Cluster) Stop() {
	if c.stopped || c.external {
		return
	}
	c.stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(c.HackDir, "ceph-down.sh"), c.Dir).CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cephtest: ceph-down.sh: %v: %s\n", err, out)
		return
	}
	_ = os.RemoveAll(filepath.Dir(c.Dir))
}

// Target reaches the cluster as its admin.
// The monitor is named with its protocol (v2:), as a client must name
// one on a port other than msgr2's 3300.
func (c *Cluster) Target() ceph.Target {
	return ceph.Target{Monitors: []string{"v2:" + c.Monitor}, User: c.User, Key: c.Key}
}

// Secrets are the CSI secrets for the cluster's admin user.
func (c *Cluster) Secrets() map[string]string {
	return map[string]string{"userID": c.User, "userKey": c.Key}
}

// RBD runs the rbd CLI as admin.
func (c *Cluster) RBD(ctx context.Context, args ...string) ([]byte, error) {
	return c.cli(ctx, "rbd", args...)
}

// Ceph runs the ceph CLI as admin.
func (c *Cluster) Ceph(ctx context.Context, args ...string) ([]byte, error) {
	return c.cli(ctx, "ceph", args...)
}

func (c *Cluster) cli(ctx context.Context, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, append(args, "-c", c.Conf)...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Env is the cluster as the contract uses it, with dialer the client
// under test.
func (c *Cluster) Env(dialer ceph.Dialer) Env {
	return Env{Dialer: dialer, Target: c.Target(), Pool: Pool, OtherPool: OtherPool, Namespace: Namespace, Admin: cliAdmin{c}, Await: time.Minute}
}

// cliAdmin is the contract's Admin through the rbd CLI: another client
// than the one under test.
type cliAdmin struct{ c *Cluster }

func (a cliAdmin) Protect(ctx context.Context, s ceph.ImageSpec, snap string) error {
	_, err := a.c.RBD(ctx, "snap", "protect", s.At(snap))
	return err
}

func (a cliAdmin) CloneV1(ctx context.Context, parent ceph.ImageSpec, snap string, child ceph.ImageSpec) error {
	_, err := a.c.RBD(ctx, "clone", "--rbd-default-clone-format", "1", "--image-feature", "layering", parent.At(snap), child.String())
	return err
}

func (a cliAdmin) Lock(ctx context.Context, s ceph.ImageSpec, cookie string) error {
	_, err := a.c.RBD(ctx, "lock", "add", s.String(), cookie)
	return err
}

// Watchers lists an image's watchers as "rbd status" shows them.
func (c *Cluster) Watchers(ctx context.Context, spec string) ([]string, error) {
	out, err := c.RBD(ctx, "status", "--format", "json", spec)
	if err != nil {
		return nil, err
	}
	var st struct {
		Watchers []struct {
			Address string `json:"address"`
		} `json:"watchers"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("rbd status %s: %w", spec, err)
	}
	var addrs []string
	for _, w := range st.Watchers {
		addrs = append(addrs, w.Address)
	}
	return addrs, nil
}

// Watch runs "rbd watch" on the image until stop, and returns its
// client's address as the image's watchers show it.
func (a cliAdmin) Watch(ctx context.Context, s ceph.ImageSpec) (string, func(), error) {
	before, err := a.c.Watchers(ctx, s.String())
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command("rbd", "watch", s.String(), "-c", a.c.Conf)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	// rbd watch runs until it reads a line (or end of file) on stdin.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		now, err := a.c.Watchers(ctx, s.String())
		if err != nil {
			stop()
			return "", nil, err
		}
		for _, w := range now {
			if !slices.Contains(before, w) {
				return w, stop, nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	return "", nil, fmt.Errorf("rbd watch %s: no new watcher within 30 s", s)
}
