// Package driver serves Spindle's three CSI services (identity.go,
// controller.go and snapshots.go, node.go) and the operators' HTTP
// endpoints (ops.go) over the controller side (internal/controller) and
// the node side (internal/node). It translates only: request validation
// and bounds, the capability matrix, the node's per-volume locks, logging,
// and the single mapping from errors to gRPC codes (errors.go).
package driver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/attachd"
	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/config"
	"github.com/spindle-csi/spindle/internal/controller"
	"github.com/spindle-csi/spindle/internal/kms"
	"github.com/spindle-csi/spindle/internal/metrics"
	"github.com/spindle-csi/spindle/internal/node"
	"github.com/spindle-csi/spindle/internal/oplock"
)

// Driver serves the CSI services of one Spindle process.
type Driver struct {
	opts      config.Options
	version   string
	instances backend.Instances
	// ctrl is the controller side; its services are served in controller mode.
	ctrl *controller.Controller
	// node is the node side; nil in controller mode.
	node *node.Volumes
	// attachDaemon runs the node's userspace daemons (--attach-daemon-socket);
	// nil when the node plugin runs them itself.
	attachDaemon command.DaemonHost
	// locks allow one operation per volume at a time, shared by both sides.
	locks   *oplock.Locks
	log     *zap.Logger
	metrics *metrics.Metrics
	// codec decodes requests; checkDecoded answers those it could not.
	codec *lenientCodec
	// kms are the KMSs of encrypted volumes (--kms-config).
	kms *kms.Registry

	// opsAddr is the address the operators' HTTP endpoints listen on,
	// once Run has opened it (--metrics-address may ask for port 0).
	opsAddrMu sync.Mutex
	opsAddr   string
}

// New builds a driver from validated options: it loads the backend config
// (or the default loop instance) and opens every backend instance.
func New(opts config.Options, version string, log *zap.Logger) (*Driver, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	var file *config.File
	var err error
	if opts.ConfigFile != "" {
		file, err = config.LoadFile(opts.ConfigFile)
	} else {
		file, err = config.DefaultFile(opts.LoopPoolDir)
	}
	if err != nil {
		return nil, err
	}
	// The command observer records into the driver's metrics; no command
	// runs before the driver below is built.
	var d *Driver
	var daemons *attachd.Client
	run := command.New(utilexec.New(), func(o command.Observation) {
		if ce := log.Check(zap.DebugLevel, "command"); ce != nil {
			ce.Write(zap.String("name", o.Name), zap.Strings("args", o.Args), zap.Duration("duration", o.Duration), zap.Int("exitCode", o.ExitCode))
		}
		if d != nil {
			d.metrics.ObserveCommand(o.Name, o.ExitCode, o.Duration)
		}
	})
	if opts.Mode.Node() && opts.AttachDaemonSocket != "" {
		// The userspace daemons of attached volumes start in the attach
		// daemon, so they outlive this process (internal/attachd).
		daemons = attachd.NewClient(opts.AttachDaemonSocket)
		run = run.WithDaemons(command.New(daemons, func(o command.Observation) {
			if d != nil {
				d.metrics.ObserveCommand(o.Name, o.ExitCode, o.Duration)
			}
		}), daemons)
	}
	instances := backend.Instances{}
	for _, b := range file.Backends {
		inst, err := b.Section.New(b.Name, run)
		if err != nil {
			return nil, fmt.Errorf("backend %s: %w", b.Key(), err)
		}
		instances[inst.Key()] = inst
	}
	built, err := newDriver(opts, version, instances, file.Default(), node.NewLinuxHost(run), log)
	if err != nil {
		return nil, err
	}
	d = built
	if opts.Mode.Controller() {
		d.ctrl.Reconcile(context.Background())
	}
	if daemons != nil {
		d.attachDaemon = daemons
	}
	return d, nil
}

// newDriver assembles a driver from backend instances and the host its node
// side works on, already built (New's last step; tests call it with
// instances on fake loop devices and an in-memory host).
func newDriver(opts config.Options, version string, instances backend.Instances, defaultInstance string, host node.Host, log *zap.Logger) (*Driver, error) {
	if version == "" {
		version = "unknown"
	}
	kmsRegistry, err := kms.Load(opts.KMSConfigFile)
	if err != nil {
		return nil, fmt.Errorf("--kms-config: %w", err)
	}
	d := &Driver{
		kms:       kmsRegistry,
		opts:      opts,
		version:   version,
		instances: instances,
		locks:     oplock.New(),
		codec:     newLenientCodec(),
		log:       log,
		metrics:   metrics.New(),
	}
	d.ctrl = controller.New(controller.Options{
		Instances: instances, DefaultInstance: defaultInstance, NodeID: opts.NodeID, KMS: kmsRegistry, Locks: d.locks, Log: log,
	})
	if opts.Mode.Controller() {
		d.metrics.SetBackgroundTasks(d.ctrl.BackgroundTasks)
	}
	if opts.Mode.Node() {
		volumes, err := node.New(host, node.Options{
			NodeID: opts.NodeID, PathRoots: opts.PathRoots(), StageRecordsRoot: opts.StageRecordsRoot(), StaticRecordsDir: opts.StaticRecordsDir(),
			OwnerOf: d.ownerOf, ObserveFormat: d.metrics.ObserveFormat, Log: log,
		})
		if err != nil {
			return nil, err
		}
		d.node = volumes
		d.metrics.SetVolumeState(d.volumeCounts)
	}
	return d, nil
}

// shutdownGrace is how long in-flight RPCs may run after a stop signal
// before the server closes their connections.
const shutdownGrace = 20 * time.Second

// Run serves until ctx is cancelled, then stops gracefully.
func (d *Driver) Run(ctx context.Context) error {
	socket, err := config.SocketPath(d.opts.Endpoint)
	if err != nil {
		return err
	}
	if d.opts.Mode.Node() {
		if err := d.registerNode(ctx); err != nil {
			return err
		}
		// Before the socket exists, so no RPC can stage meanwhile.
		d.node.ForgetEarlierBoots()
	}
	// The operators' endpoints come up before the CSI socket, so whoever
	// sees the socket can also read MetricsAddress.
	if d.opts.MetricsAddress != "" {
		stopOps, err := d.serveOps(d.opts.MetricsAddress)
		if err != nil {
			return fmt.Errorf("--metrics-address: %w", err)
		}
		defer stopOps()
	}
	lis, err := listenUnix(socket)
	if err != nil {
		return err
	}
	defer os.Remove(socket)

	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(d.interceptors()...), grpc.ForceServerCodecV2(d.codec))
	csi.RegisterIdentityServer(srv, &identityService{d: d})
	if d.opts.Mode.Controller() {
		csi.RegisterControllerServer(srv, &controllerService{d: d})
		csi.RegisterGroupControllerServer(srv, &groupControllerService{d: d}) // snapshots.go
		go d.ctrl.Maintain(ctx)
	}
	if d.opts.Mode.Node() {
		csi.RegisterNodeServer(srv, &nodeService{d: d})
	}

	d.log.Info("serving",
		zap.String("driver", d.opts.DriverName), zap.String("version", d.version),
		zap.String("mode", string(d.opts.Mode)), zap.String("nodeID", d.opts.NodeID),
		zap.String("endpoint", socket), zap.Strings("backends", d.instances.Keys()), zap.String("defaultBackend", d.ctrl.DefaultInstance()))

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(lis) }()
	if d.opts.Mode.Node() {
		reconciled := make(chan struct{})
		go func() { defer close(reconciled); d.reconcileNode(ctx) }()
		defer func() { <-reconciled }()
	}

	if d.opts.PluginRegistrationDir != "" {
		stopRegistration, err := d.serveRegistration(socket)
		if err != nil {
			srv.Stop()
			return fmt.Errorf("kubelet plugin registration: %w", err)
		}
		defer stopRegistration()
	}

	select {
	case err := <-serveErr:
		return err
	case <-ctx.Done():
	}
	d.log.Info("stopping: waiting for in-flight RPCs", zap.Duration("grace", shutdownGrace))
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(shutdownGrace):
		d.log.Warn("in-flight RPCs did not finish in time; closing connections")
		srv.Stop()
	}
	d.log.Info("stopped")
	return nil
}

// reconcileTimeout bounds the start-up look at the node's volumes.
const reconcileTimeout = 2 * time.Minute

// reconcileNode looks at the volumes an earlier run of the node plugin
// staged and logs what it finds (node.Volumes.Reconcile), while the plugin
// already serves: it only reads, and a node with many volumes (an identity
// check each) must not wait for it, nor must the volumes' pods.
func (d *Driver) reconcileNode(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, reconcileTimeout)
	defer cancel()
	d.node.Reconcile(ctx, d.resolveVolume)
}

// registerNode announces this node to every backend instance.
func (d *Driver) registerNode(ctx context.Context) error {
	var errs []error
	for _, key := range d.instances.Keys() {
		info := backend.NodeInfo{NodeID: d.opts.NodeID, MaxVolumesPerNode: d.opts.MaxVolumesPerNode}
		if err := d.instances[key].Attacher.RegisterNode(ctx, info); err != nil {
			errs = append(errs, fmt.Errorf("register node %q with %s: %w", d.opts.NodeID, key, err))
		}
	}
	return errors.Join(errs...)
}

// umaskMu serialises the umask change around socket creation; umask is
// process-wide.
var umaskMu sync.Mutex

// listenUnix listens on path: a stale socket left by a previous run is
// removed (a live one, or anything else at that path, is an error), and the
// new socket is created mode 0600 so only root can talk to the plugin.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket; refusing to remove it", path)
		}
		// A socket somebody still accepts on is not stale: taking it over
		// would cut a running plugin off from kubelet without a word.
		if conn, err := net.DialTimeout("unix", path, time.Second); err == nil {
			conn.Close()
			return nil, fmt.Errorf("%s is served by another running process; refusing to take it over", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	umaskMu.Lock()
	old := syscall.Umask(0o177)
	lis, err := net.Listen("unix", path)
	syscall.Umask(old)
	umaskMu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return nil, err
	}
	return lis, nil
}
