// Package harness runs a real Spindle driver for end-to-end tests, the demo
// and the benchmark: in-process (tests) or as a child process (demo, bench),
// on a real loop pool, over its real unix socket. It also checks that a test
// left no loop device and no mount behind.
package harness

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/testutil"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/container-storage-interface/spec/lib/go/csi"

	// The backend types the driver can configure.
	_ "github.com/spindle-csi/spindle/internal/backend/all"
	"github.com/spindle-csi/spindle/internal/config"
	"github.com/spindle-csi/spindle/internal/driver"
)

// NodeID is the node ID drivers started by the harness use.
const NodeID = "spindle-test-node"

// Driver is a running driver and a client connection to it.
type Driver struct {
	Socket  string
	PoolDir string
	Conn    *grpc.ClientConn
	// Process is the driver's process when it runs as a child (StartProcess).
	Process *os.Process
	// MetricsURL is "http://host:port" of the operators' endpoints
	// (/metrics, /healthz, /volumes, /images) when Options.Metrics is set.
	MetricsURL string
	// KubeletDir is the driver's --kubelet-dir (in-process drivers): a
	// volume staged below KubeletDir/plugins/kubernetes.io/csi is in the
	// node's inventory, as one kubelet staged is.
	KubeletDir string

	Identity   csi.IdentityClient
	Controller csi.ControllerClient
	Node       csi.NodeClient

	exited <-chan error
}

// Options tune a driver started by the harness.
type Options struct {
	// PoolDir defaults to a fresh directory under the test's temp dir.
	PoolDir string
	// MaxVolumesPerNode is passed to --max-volumes-per-node.
	MaxVolumesPerNode int64
	// NodeLocal configures the loop instance as node-local, so the driver
	// reports topology (through a --config file).
	NodeLocal bool
	// Config, when set, is the backend configuration file's content
	// (--config) for another backend; PoolDir and NodeLocal then only
	// name the directory the leak check watches.
	Config string
	// Logger defaults to the test's log.
	Logger *zap.Logger
	// Metrics serves the operators' endpoints on a free loopback port
	// (Driver.MetricsURL).
	Metrics bool
	// NodeID defaults to NodeID; two drivers with different node IDs
	// play two nodes on one host.
	NodeID string
	// Mode defaults to config.ModeAll. A driver in config.ModeController
	// and one in config.ModeNode play a controller and a node plugin that
	// share no files, only the backend's network.
	Mode config.Mode
	// AllowedPathRoots are the driver's --allowed-path-root directories,
	// besides its --kubelet-dir; nil allows the system's temporary
	// directory, where tests make their staging and target paths.
	AllowedPathRoots []string
}

// Start runs a driver in this process (mode all, unless Options.Mode) on a
// temporary socket and pool, and stops it, checking for leaks, when the
// test ends.
func Start(t testing.TB, o Options) *Driver {
	t.Helper()
	testutil.RequireRoot(t, "bind real loop devices and mount real filesystems")
	testutil.RequireCommands(t, "losetup", "blkid", "mount", "umount", "mkfs.ext4")
	dir := TempDir(t)
	if o.PoolDir == "" {
		o.PoolDir = filepath.Join(dir, "pool")
	}
	if o.Logger == nil {
		o.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	}
	o.Logger = recordLatencies(t, o.Logger)
	socket := filepath.Join(dir, "csi.sock")
	if o.NodeID == "" {
		o.NodeID = NodeID
	}
	if o.Mode == "" {
		o.Mode = config.ModeAll
	}
	opts := config.Options{
		Endpoint:          "unix://" + socket,
		Mode:              o.Mode,
		NodeID:            o.NodeID,
		DriverName:        config.DefaultDriverName,
		LoopPoolDir:       o.PoolDir,
		MaxVolumesPerNode: o.MaxVolumesPerNode,
		LogFormat:         "json",
		LogLevel:          "info",
		KubeletDir:        filepath.Join(dir, "kubelet"),
		AllowedPathRoots:  o.AllowedPathRoots,
	}
	if opts.AllowedPathRoots == nil {
		opts.AllowedPathRoots = []string{os.TempDir()}
	}
	if o.Metrics {
		opts.MetricsAddress = "127.0.0.1:0"
	}
	cfg := o.Config
	if cfg == "" && o.NodeLocal {
		cfg = fmt.Sprintf("backends:\n  - type: loop\n    name: default\n    loop:\n      poolDir: %q\n      nodeLocal: true\n", o.PoolDir)
	}
	if cfg != "" {
		opts.ConfigFile = filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(opts.ConfigFile, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d, err := driver.New(opts, "v0.0.0-test", o.Logger)
	if err != nil {
		t.Fatalf("driver.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("driver stopped with %v", err)
		}
	})
	drv, err := Connect(socket, done)
	if err != nil {
		t.Fatal(err)
	}
	drv.PoolDir = o.PoolDir
	drv.KubeletDir = opts.KubeletDir
	if o.Metrics {
		// Run opens the metrics listener before the socket Connect waited for.
		drv.MetricsURL = "http://" + d.MetricsAddress()
	}
	t.Cleanup(func() { drv.Conn.Close() })
	CheckNoLeaks(t, o.PoolDir, dir)
	return drv
}

// FilesystemPool makes a pool directory on a filesystem of its own (fsType,
// on a loop device over a sparse file) and returns it; everything is
// unmounted and detached when the test ends. Tests use it for pools that can
// reflink (xfs, btrfs), unlike the ext4 or tmpfs that usually holds /tmp.
func FilesystemPool(t testing.TB, fsType string, sizeBytes int64) string {
	t.Helper()
	return testutil.ScratchFilesystem(t, fsType, sizeBytes, "-q")
}

// ProcessOptions describe a driver run as a child process from its binary,
// as the demo and the benchmark do: the same binary users deploy.
type ProcessOptions struct {
	Binary  string // path to the spindle binary
	WorkDir string // holds the socket, the pool (unless PoolDir) and the log
	PoolDir string // defaults to WorkDir/pool
	// LogLevel defaults to "warn"; the log goes to WorkDir/spindle.log.
	LogLevel string
	// ExtraArgs are more flags for the driver (e.g. --allowed-path-root).
	ExtraArgs []string
}

// StartProcess starts the driver binary (mode all, loop backend) and
// connects to it. Stop it with (*Driver).Stop.
func StartProcess(o ProcessOptions) (*Driver, error) {
	if o.PoolDir == "" {
		o.PoolDir = filepath.Join(o.WorkDir, "pool")
	}
	if o.LogLevel == "" {
		o.LogLevel = "warn"
	}
	socket := filepath.Join(o.WorkDir, "csi.sock")
	logFile, err := os.Create(filepath.Join(o.WorkDir, "spindle.log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child holds its own descriptor
	args := []string{
		"--endpoint=unix://" + socket,
		"--mode=all",
		"--node-id=" + NodeID,
		"--loop-pool-dir=" + o.PoolDir,
		// The staging and target paths are made in the work directory.
		"--allowed-path-root=" + o.WorkDir,
		"--log-format=console",
		"--log-level=" + o.LogLevel,
	}
	cmd := exec.Command(o.Binary, append(args, o.ExtraArgs...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// A harness killed before it could stop the driver takes the driver
	// with it, so no orphaned plugin keeps serving a removed work dir.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", o.Binary, err)
	}
	died := make(chan error, 1)
	go func() { died <- cmd.Wait() }()
	drv, err := Connect(socket, died)
	if err != nil {
		_ = cmd.Process.Kill()
		log, _ := os.ReadFile(logFile.Name())
		return nil, fmt.Errorf("%w; driver log:\n%s", err, log)
	}
	drv.PoolDir = o.PoolDir
	drv.Process = cmd.Process
	drv.exited = died
	return drv, nil
}

// Stop closes the connection and, for a child process, sends SIGTERM and
// waits for a graceful exit.
func (d *Driver) Stop() error {
	d.Conn.Close()
	if d.Process == nil {
		return nil
	}
	if err := d.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case err := <-d.exited:
		if err != nil {
			return fmt.Errorf("driver exited with %w", err)
		}
		return nil
	case <-time.After(30 * time.Second):
		_ = d.Process.Kill()
		return fmt.Errorf("driver did not stop within 30s of SIGTERM")
	}
}

// RSSBytes is the resident set size of a child-process driver.
func (d *Driver) RSSBytes() (int64, error) { return d.statusBytes("VmRSS:") }

// PeakRSSBytes is the largest resident set size the child-process driver
// has had (VmHWM).
func (d *Driver) PeakRSSBytes() (int64, error) { return d.statusBytes("VmHWM:") }

func (d *Driver) statusBytes(key string) (int64, error) {
	if d.Process == nil {
		return 0, fmt.Errorf("driver runs in-process")
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			var kib int64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kib); err != nil {
				return 0, err
			}
			return kib << 10, nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", key, d.Process.Pid)
}

// Connect waits for the socket and dials it. died, when not nil, reports a
// driver that exited before its socket appeared.
func Connect(socket string, died <-chan error) (*Driver, error) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := os.Stat(socket); err == nil {
			break
		}
		select {
		case err := <-died:
			return nil, fmt.Errorf("driver exited before serving: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("socket %s did not appear", socket)
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &Driver{
		Socket: socket, Conn: conn,
		Identity: csi.NewIdentityClient(conn), Controller: csi.NewControllerClient(conn), Node: csi.NewNodeClient(conn),
	}, nil
}

// TempDir is t.TempDir that also survives mounts: t.TempDir's removal would
// fail (and hide the real problem) if a test left a mount inside, so the leak
// check runs first.
func TempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "spindle-"+sanitize(t.Name())+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove test directory: %v", err)
		}
	})
	return dir
}

func sanitize(name string) string {
	r := strings.NewReplacer("/", "_", " ", "_")
	name = r.Replace(name)
	if len(name) > 40 {
		name = name[:40]
	}
	return name
}

// CheckNoLeaks registers a cleanup that fails t if, when the test ends, a
// loop device is still bound to a file under poolDir or anything is still
// mounted under dir. It then detaches and unmounts them, so one failing test
// does not poison the machine for the next. A device already bound to the
// same file when CheckNoLeaks is called is not t's: an enclosing test's
// volume, still in use (the encrypted data-path benchmark runs beside the
// plain volume it compares with).
func CheckNoLeaks(t testing.TB, poolDir, dir string) {
	before := loopBindingsUnder(poolDir)
	t.Cleanup(func() {
		for _, m := range MountsUnder(dir) {
			t.Errorf("mount left behind: %s", m)
			_ = exec.Command("umount", "-l", m).Run()
		}
		after := loopBindingsUnder(poolDir)
		for _, dev := range slices.Sorted(maps.Keys(after)) {
			if file, ok := before[dev]; ok && file == after[dev] {
				continue
			}
			t.Errorf("loop device left behind: %s (%s)", dev, after[dev])
			_ = exec.Command("losetup", "-d", dev).Run()
		}
	})
}

// MountsUnder lists mount points at or below dir, deepest first.
func MountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			out = append([]string{fields[4]}, out...)
		}
	}
	return out
}

// LoopDevicesUnder lists loop devices whose backing file is below dir.
func LoopDevicesUnder(dir string) []string {
	return slices.Sorted(maps.Keys(loopBindingsUnder(dir)))
}

// loopBindingsUnder maps each loop device bound to a file under dir to
// that file.
func loopBindingsUnder(dir string) map[string]string {
	resolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		resolved = dir
	}
	paths, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	out := map[string]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if file := strings.TrimSpace(string(b)); strings.HasPrefix(file, resolved+"/") {
			out["/dev/"+filepath.Base(filepath.Dir(filepath.Dir(p)))] = file
		}
	}
	return out
}
