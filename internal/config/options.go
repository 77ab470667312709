// Package config holds the driver's start-up options (flags) and the backend
// configuration file the Helm chart renders.
package config

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Mode selects which CSI services the process serves.
type Mode string

const (
	ModeController Mode = "controller"
	ModeNode       Mode = "node"
	ModeAll        Mode = "all"
	// ModeAttachDaemon serves no CSI service: it runs the userspace
	// daemons of attached volumes for the node plugin (internal/attachd),
	// in a pod that outlives the node plugin's restarts and upgrades.
	ModeAttachDaemon Mode = "attach-daemon"
)

// Controller and Node report whether the mode includes that service.
func (m Mode) Controller() bool { return m == ModeController || m == ModeAll }
func (m Mode) Node() bool       { return m == ModeNode || m == ModeAll }

// Defaults.
const (
	DefaultDriverName  = "spindle.csi.dev"
	DefaultEndpoint    = "unix:///run/spindle/csi.sock"
	DefaultLoopPoolDir = "/var/lib/spindle/pools/default"
	DefaultKubeletDir  = "/var/lib/kubelet"
)

// Options are the driver's command-line options.
type Options struct {
	Endpoint          string
	Mode              Mode
	NodeID            string
	DriverName        string
	ConfigFile        string
	LoopPoolDir       string
	MaxVolumesPerNode int64
	LogFormat         string
	LogLevel          string
	// PluginRegistrationDir is kubelet's plugin-watcher directory; when set,
	// the node plugin registers itself with kubelet there (what the
	// node-driver-registrar sidecar does otherwise).
	PluginRegistrationDir string
	// KubeletRegistrationPath is the CSI socket's path as kubelet sees it
	// (it differs from --endpoint when the plugin runs in a container);
	// the endpoint's path when empty.
	KubeletRegistrationPath string
	// MetricsAddress is host:port for the operators' HTTP endpoints
	// (/metrics, /healthz, /volumes, /images); empty serves none.
	MetricsAddress string
	// KubeletDir is kubelet's --root-dir as the node plugin sees it; the
	// node's inventory (/volumes, the staged gauge) finds the stage
	// records below its plugins/kubernetes.io/csi.
	KubeletDir string
	// AllowedPathRoots are directories besides KubeletDir below which
	// Node requests may name paths (--allowed-path-root, repeatable):
	// for test tools such as csi-sanity that use a temporary directory.
	AllowedPathRoots []string
	// AttachDaemonSocket is the attach daemon's socket: where it listens
	// (--mode=attach-daemon), and where a node plugin has the userspace
	// daemons of its volumes started, so that they outlive its restarts.
	// Empty: a node plugin starts them itself.
	AttachDaemonSocket string
	// KMSConfigFile maps each encryptionKMSID to its KMS's settings (JSON,
	// internal/kms); without it only the built-in secrets KMS exists.
	KMSConfigFile string
}

// AddFlags registers the options on fs, with their defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	hostname, _ := os.Hostname()
	fs.StringVar(&o.Endpoint, "endpoint", DefaultEndpoint, "CSI endpoint: unix:///path, unix:path or a bare path to the socket")
	fs.Func("mode", "services to serve: controller, node or all (default all); attach-daemon runs the userspace daemons of a node's volumes for its node plugin", func(s string) error {
		o.Mode = Mode(s)
		return nil
	})
	o.Mode = ModeAll
	fs.StringVar(&o.NodeID, "node-id", hostname, "this node's ID as reported by NodeGetInfo")
	fs.StringVar(&o.DriverName, "driver-name", DefaultDriverName, "CSI driver name")
	fs.StringVar(&o.ConfigFile, "config", "", "backend configuration file (YAML); without it the driver serves one loop instance \"default\" in --loop-pool-dir")
	fs.StringVar(&o.LoopPoolDir, "loop-pool-dir", DefaultLoopPoolDir, "pool directory of the default loop instance, used when --config is not given")
	fs.Int64Var(&o.MaxVolumesPerNode, "max-volumes-per-node", 0, "volumes this node can have attached, reported by NodeGetInfo; 0 means no limit")
	fs.StringVar(&o.LogFormat, "log-format", "json", "log format: json or console")
	fs.StringVar(&o.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&o.PluginRegistrationDir, "plugin-registration-dir", "", "kubelet's plugin registration directory (e.g. /var/lib/kubelet/plugins_registry); when set, the node plugin registers itself with kubelet instead of relying on node-driver-registrar")
	fs.StringVar(&o.MetricsAddress, "metrics-address", "", "host:port to serve /metrics, /healthz, /volumes (node) and /images (controller) on, e.g. 127.0.0.1:9808; empty serves nothing")
	fs.StringVar(&o.KubeletDir, "kubelet-dir", DefaultKubeletDir, "kubelet's root directory as this process sees it; the node plugin finds its stage records below <kubelet-dir>/plugins/kubernetes.io/csi")
	fs.Func("allowed-path-root", "a directory besides --kubelet-dir below which Node requests may name staging and target paths (repeatable; for test tools such as csi-sanity)", func(s string) error {
		o.AllowedPathRoots = append(o.AllowedPathRoots, s)
		return nil
	})
	fs.StringVar(&o.AttachDaemonSocket, "attach-daemon-socket", "", "the attach daemon's socket: where --mode=attach-daemon listens, and where a node plugin has the userspace daemons of its volumes (rbd-fuse, rbd-nbd, qemu-storage-daemon) started so that they outlive its restarts; empty: the node plugin starts them itself")
	fs.StringVar(&o.KMSConfigFile, "kms-config", "", "KMS configuration (JSON, ceph-csi's layout: encryptionKMSID -> settings) for encrypted volumes; without it only the built-in Kubernetes-Secret KMS (encryptionKMSID \"secrets\") exists")
	fs.StringVar(&o.KubeletRegistrationPath, "kubelet-registration-path", "", "the CSI socket's path as kubelet sees it, announced at registration (default: the --endpoint path)")
}

// RegistrationSocket is the socket kubelet's plugin watcher finds: named
// after the driver, as node-driver-registrar names it, so either can serve
// a node (not both at once).
func (o *Options) RegistrationSocket() string {
	return filepath.Join(o.PluginRegistrationDir, o.DriverName+"-reg.sock")
}

var (
	// CSI: driver names are domain-name-like, at most 63 characters.
	driverNameRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)
	nodeIDRe     = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?$`)
)

// ValidateNodeID checks a node ID: it names files in shared pools and
// appears in VolumeAttachments, so it is kept to a safe alphabet.
func ValidateNodeID(id string) error {
	if !nodeIDRe.MatchString(id) {
		return fmt.Errorf("node ID %q must be 1-128 characters of [A-Za-z0-9._-], starting and ending with a letter or digit", id)
	}
	return nil
}

// Validate checks every option and reports all problems at once.
func (o *Options) Validate() error {
	var errs []error
	if _, err := SocketPath(o.Endpoint); err != nil {
		errs = append(errs, err)
	}
	switch o.Mode {
	case ModeController, ModeNode, ModeAll:
	case ModeAttachDaemon:
		if o.AttachDaemonSocket == "" {
			errs = append(errs, errors.New("--mode=attach-daemon needs --attach-daemon-socket"))
		}
	default:
		errs = append(errs, fmt.Errorf("--mode=%q: must be controller, node, all or attach-daemon", o.Mode))
	}
	if o.AttachDaemonSocket != "" && !filepath.IsAbs(o.AttachDaemonSocket) {
		errs = append(errs, fmt.Errorf("--attach-daemon-socket=%q: must be an absolute path", o.AttachDaemonSocket))
	}
	if o.AttachDaemonSocket != "" && o.Mode == ModeController {
		errs = append(errs, errors.New("--attach-daemon-socket: a controller attaches nothing; only a node plugin uses the attach daemon"))
	}
	if o.Mode.Node() {
		if err := ValidateNodeID(o.NodeID); err != nil {
			errs = append(errs, fmt.Errorf("--node-id: %w", err))
		}
	}
	if !driverNameRe.MatchString(o.DriverName) {
		errs = append(errs, fmt.Errorf("--driver-name=%q: must be a domain name of at most 63 characters (lower case, digits, '.' and '-')", o.DriverName))
	}
	if o.ConfigFile == "" && !filepath.IsAbs(o.LoopPoolDir) {
		errs = append(errs, fmt.Errorf("--loop-pool-dir=%q: must be an absolute path", o.LoopPoolDir))
	}
	if o.MaxVolumesPerNode < 0 {
		errs = append(errs, fmt.Errorf("--max-volumes-per-node=%d: must not be negative", o.MaxVolumesPerNode))
	}
	if o.PluginRegistrationDir != "" {
		if !o.Mode.Node() {
			errs = append(errs, fmt.Errorf("--plugin-registration-dir: only a node plugin registers with kubelet, not --mode=%s", o.Mode))
		}
		if !filepath.IsAbs(o.PluginRegistrationDir) {
			errs = append(errs, fmt.Errorf("--plugin-registration-dir=%q: must be an absolute path", o.PluginRegistrationDir))
		}
	}
	if o.KubeletRegistrationPath != "" && !filepath.IsAbs(o.KubeletRegistrationPath) {
		errs = append(errs, fmt.Errorf("--kubelet-registration-path=%q: must be an absolute path", o.KubeletRegistrationPath))
	}
	if o.MetricsAddress != "" {
		if err := validateListenAddress(o.MetricsAddress); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-address=%q: %w", o.MetricsAddress, err))
		}
	}
	if o.Mode.Node() && o.KubeletDir != "" && !filepath.IsAbs(o.KubeletDir) {
		errs = append(errs, fmt.Errorf("--kubelet-dir=%q: must be an absolute path", o.KubeletDir))
	}
	if o.Mode.Node() {
		for _, r := range o.AllowedPathRoots {
			if !filepath.IsAbs(r) || filepath.Clean(r) == "/" {
				errs = append(errs, fmt.Errorf("--allowed-path-root=%q: must be an absolute path other than /", r))
			}
		}
		if filepath.Clean(o.KubeletDir) == "/" {
			errs = append(errs, errors.New("--kubelet-dir=\"/\": kubelet's directory cannot be /"))
		}
		if o.KubeletDir == "" && len(o.AllowedPathRoots) == 0 {
			errs = append(errs, errors.New("--kubelet-dir is empty and no --allowed-path-root is given: the node plugin would accept no staging or target path"))
		}
	}
	switch o.LogFormat {
	case "json", "console":
	default:
		errs = append(errs, fmt.Errorf("--log-format=%q: must be json or console", o.LogFormat))
	}
	switch o.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("--log-level=%q: must be debug, info, warn or error", o.LogLevel))
	}
	return errors.Join(errs...)
}

// StageRecordsRoot is where the node plugin looks for its stage records:
// kubelet's CSI plugin directory, which holds every staging path.
func (o *Options) StageRecordsRoot() string {
	if o.KubeletDir == "" {
		return ""
	}
	return filepath.Join(o.KubeletDir, "plugins", "kubernetes.io", "csi")
}

// StaticRecordsDir is where the node plugin keeps its records of the
// pre-provisioned volumes it stages: beside its socket, which the chart
// keeps on the host (<kubelet>/plugins/<driver>), so they outlive the node
// plugin's pod. Node plugins have kept them there since they served such
// volumes; "" when the endpoint names no socket.
func (o *Options) StaticRecordsDir() string {
	socket, err := SocketPath(o.Endpoint)
	if err != nil {
		return ""
	}
	return filepath.Join(filepath.Dir(socket), "static-volumes")
}

// PathRoots are the directories below which the node plugin accepts the
// paths of Node requests: kubelet's directory and the allowed roots.
func (o *Options) PathRoots() []string {
	var roots []string
	if o.KubeletDir != "" {
		roots = append(roots, o.KubeletDir)
	}
	return append(roots, o.AllowedPathRoots...)
}

// validateListenAddress checks a TCP listen address: host:port, the host
// may be empty (all addresses), the port a number (0 picks a free one).
func validateListenAddress(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("must be host:port: %w", err)
	}
	if strings.ContainsAny(host, "/ ") {
		return fmt.Errorf("host %q is not a host name or IP address", host)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q must be a number from 0 to 65535", port)
	}
	return nil
}

// SocketPath turns an endpoint (unix:///path, unix:path or a bare absolute
// path) into the socket's path.
func SocketPath(endpoint string) (string, error) {
	path := endpoint
	switch {
	case strings.HasPrefix(endpoint, "unix://"):
		path = strings.TrimPrefix(endpoint, "unix://")
	case strings.HasPrefix(endpoint, "unix:"):
		path = strings.TrimPrefix(endpoint, "unix:")
	case strings.Contains(endpoint, "://"):
		return "", fmt.Errorf("--endpoint=%q: only unix sockets are supported", endpoint)
	}
	if path == "" || !filepath.IsAbs(path) {
		return "", fmt.Errorf("--endpoint=%q: the socket must be an absolute path", endpoint)
	}
	return filepath.Clean(path), nil
}
