package config

import (
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
)

func validOptions() Options {
	return Options{
		Endpoint:    "unix:///run/spindle/csi.sock",
		Mode:        ModeAll,
		NodeID:      "node-1.example",
		DriverName:  DefaultDriverName,
		LoopPoolDir: "/var/lib/spindle/pools/default",
		LogFormat:   "json",
		LogLevel:    "info",
		KubeletDir:  DefaultKubeletDir,
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Options)
		// want lists what the error must mention; empty: valid.
		want []string
	}{
		{name: "valid", change: func(*Options) {}},
		{name: "controller mode needs no node ID", change: func(o *Options) { o.Mode, o.NodeID = ModeController, "" }},
		{name: "node mode", change: func(o *Options) { o.Mode = ModeNode }},
		{name: "console logs at debug", change: func(o *Options) { o.LogFormat, o.LogLevel = "console", "debug" }},
		{name: "pool dir unused with a config file", change: func(o *Options) { o.ConfigFile, o.LoopPoolDir = "/etc/spindle/config.yaml", "relative" }},
		{name: "bare socket path", change: func(o *Options) { o.Endpoint = "/csi/csi.sock" }},
		{name: "registers with kubelet", change: func(o *Options) {
			o.PluginRegistrationDir, o.KubeletRegistrationPath = "/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/spindle.csi.dev/csi.sock"
		}},

		{name: "tcp endpoint", change: func(o *Options) { o.Endpoint = "tcp://127.0.0.1:10000" }, want: []string{"--endpoint", "only unix sockets"}},
		{name: "relative endpoint", change: func(o *Options) { o.Endpoint = "csi.sock" }, want: []string{"--endpoint", "absolute"}},
		{name: "bad mode", change: func(o *Options) { o.Mode = "both" }, want: []string{`--mode="both"`, "controller, node, all or attach-daemon"}},
		{name: "empty node ID in node mode", change: func(o *Options) { o.Mode, o.NodeID = ModeNode, "" }, want: []string{"--node-id"}},
		{name: "node ID with a slash", change: func(o *Options) { o.NodeID = "node/1" }, want: []string{"--node-id", "node/1"}},
		{name: "node ID too long", change: func(o *Options) { o.NodeID = strings.Repeat("n", 129) }, want: []string{"--node-id"}},
		{name: "upper-case driver name", change: func(o *Options) { o.DriverName = "Spindle.CSI.dev" }, want: []string{"--driver-name", "Spindle.CSI.dev"}},
		{name: "driver name too long", change: func(o *Options) { o.DriverName = strings.Repeat("a", 64) }, want: []string{"--driver-name"}},
		{name: "relative pool dir", change: func(o *Options) { o.LoopPoolDir = "pools/default" }, want: []string{`--loop-pool-dir="pools/default"`, "absolute"}},
		{name: "negative volume limit", change: func(o *Options) { o.MaxVolumesPerNode = -1 }, want: []string{"--max-volumes-per-node=-1"}},
		{name: "registration in controller mode", change: func(o *Options) {
			o.Mode, o.PluginRegistrationDir = ModeController, "/var/lib/kubelet/plugins_registry"
		}, want: []string{"--plugin-registration-dir", "--mode=controller"}},
		{name: "relative registration dir", change: func(o *Options) { o.PluginRegistrationDir = "plugins_registry" }, want: []string{`--plugin-registration-dir="plugins_registry"`, "absolute"}},
		{name: "relative kubelet registration path", change: func(o *Options) { o.KubeletRegistrationPath = "csi.sock" }, want: []string{`--kubelet-registration-path="csi.sock"`, "absolute"}},
		{name: "metrics on loopback", change: func(o *Options) { o.MetricsAddress = "127.0.0.1:9808" }},
		{name: "metrics on every address", change: func(o *Options) { o.MetricsAddress = ":9808" }},
		{name: "metrics on a free port", change: func(o *Options) { o.MetricsAddress = "[::1]:0" }},
		{name: "metrics address without a port", change: func(o *Options) { o.MetricsAddress = "127.0.0.1" }, want: []string{`--metrics-address="127.0.0.1"`, "host:port"}},
		{name: "metrics port not a number", change: func(o *Options) { o.MetricsAddress = "localhost:http" }, want: []string{"--metrics-address", "port"}},
		{name: "metrics port too large", change: func(o *Options) { o.MetricsAddress = "localhost:65536" }, want: []string{"--metrics-address", "0 to 65535"}},
		{name: "relative kubelet dir", change: func(o *Options) { o.KubeletDir = "var/lib/kubelet" }, want: []string{`--kubelet-dir="var/lib/kubelet"`, "absolute"}},
		{name: "controller ignores the kubelet dir", change: func(o *Options) { o.Mode, o.KubeletDir = ModeController, "rel" }},
		{name: "relative allowed root", change: func(o *Options) { o.AllowedPathRoots = []string{"tmp"} }, want: []string{`--allowed-path-root="tmp"`, "absolute"}},
		{name: "allowed root /", change: func(o *Options) { o.AllowedPathRoots = []string{"//"} }, want: []string{`--allowed-path-root="//"`, "other than /"}},
		{name: "kubelet dir /", change: func(o *Options) { o.KubeletDir = "/" }, want: []string{"--kubelet-dir", "cannot be /"}},
		{name: "no path root at all", change: func(o *Options) { o.KubeletDir = "" }, want: []string{"--kubelet-dir is empty", "--allowed-path-root"}},
		{name: "allowed roots without kubelet dir", change: func(o *Options) { o.KubeletDir, o.AllowedPathRoots = "", []string{"/tmp"} }},
		{name: "controller needs no path root", change: func(o *Options) { o.Mode, o.KubeletDir = ModeController, "" }},
		{name: "attach daemon", change: func(o *Options) { o.Mode, o.AttachDaemonSocket = ModeAttachDaemon, "/run/spindle/attachd.sock" }},
		{name: "attach daemon without a socket", change: func(o *Options) { o.Mode = ModeAttachDaemon }, want: []string{"--mode=attach-daemon needs --attach-daemon-socket"}},
		{name: "node plugin with an attach daemon", change: func(o *Options) { o.Mode, o.AttachDaemonSocket = ModeNode, "/run/spindle/attachd.sock" }},
		{name: "relative attach daemon socket", change: func(o *Options) { o.AttachDaemonSocket = "attachd.sock" }, want: []string{`--attach-daemon-socket="attachd.sock"`, "absolute"}},
		{name: "controller with an attach daemon", change: func(o *Options) { o.Mode, o.AttachDaemonSocket = ModeController, "/run/a.sock" }, want: []string{"only a node plugin uses the attach daemon"}},
		{name: "bad log format", change: func(o *Options) { o.LogFormat = "text" }, want: []string{`--log-format="text"`}},
		{name: "bad log level", change: func(o *Options) { o.LogLevel = "verbose" }, want: []string{`--log-level="verbose"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := validOptions()
			tc.change(&o)
			err := o.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate accepted the options")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// Every problem is reported at once, one per line, so an operator fixes the
// manifest in one go.
func TestOptionsValidateReportsAllProblems(t *testing.T) {
	o := Options{
		Endpoint: "tcp://x", Mode: ModeNode, NodeID: "", DriverName: "UPPER", LoopPoolDir: "rel",
		MaxVolumesPerNode: -2, LogFormat: "xml", LogLevel: "loud",
	}
	err := o.Validate()
	if err == nil {
		t.Fatal("Validate accepted the options")
	}
	flags := []string{"--endpoint", "--node-id", "--driver-name", "--loop-pool-dir", "--max-volumes-per-node", "--kubelet-dir", "--log-format", "--log-level"}
	for _, f := range flags {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error does not name %s:\n%v", f, err)
		}
	}
	if lines := strings.Count(err.Error(), "\n") + 1; lines != len(flags) {
		t.Errorf("error has %d lines, want one per problem (%d):\n%v", lines, len(flags), err)
	}
}

func TestAddFlags(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var o Options
	o.AddFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if o.Endpoint != DefaultEndpoint || o.Mode != ModeAll || o.DriverName != DefaultDriverName || o.LoopPoolDir != DefaultLoopPoolDir ||
		o.LogFormat != "json" || o.LogLevel != "info" || o.MaxVolumesPerNode != 0 || o.ConfigFile != "" ||
		o.MetricsAddress != "" || o.KubeletDir != DefaultKubeletDir {
		t.Errorf("defaults = %+v", o)
	}

	fs = flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o = Options{}
	o.AddFlags(fs)
	args := []string{"--endpoint=unix:/csi/csi.sock", "--mode=node", "--node-id=n1", "--driver-name=x.example.com",
		"--config=/etc/spindle.yaml", "--loop-pool-dir=/pools", "--max-volumes-per-node=16", "--log-format=console", "--log-level=debug",
		"--metrics-address=127.0.0.1:9808", "--kubelet-dir=/srv/kubelet",
		"--allowed-path-root=/tmp/csi", "--allowed-path-root=/srv/test"}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	want := Options{Endpoint: "unix:/csi/csi.sock", Mode: ModeNode, NodeID: "n1", DriverName: "x.example.com", ConfigFile: "/etc/spindle.yaml",
		LoopPoolDir: "/pools", MaxVolumesPerNode: 16, LogFormat: "console", LogLevel: "debug",
		MetricsAddress: "127.0.0.1:9808", KubeletDir: "/srv/kubelet", AllowedPathRoots: []string{"/tmp/csi", "/srv/test"}}
	if !reflect.DeepEqual(o, want) {
		t.Errorf("parsed %+v\nwant   %+v", o, want)
	}
	if got, want := o.PathRoots(), []string{"/srv/kubelet", "/tmp/csi", "/srv/test"}; !reflect.DeepEqual(got, want) {
		t.Errorf("PathRoots() = %q, want %q", got, want)
	}
}

func TestStageRecordsRoot(t *testing.T) {
	o := Options{KubeletDir: "/var/tmp/cluster/kubelet"}
	if got, want := o.StageRecordsRoot(), "/var/tmp/cluster/kubelet/plugins/kubernetes.io/csi"; got != want {
		t.Errorf("StageRecordsRoot() = %q, want %q", got, want)
	}
	if got := (&Options{}).StageRecordsRoot(); got != "" {
		t.Errorf("without a kubelet dir StageRecordsRoot() = %q, want none", got)
	}
}

func TestModeServices(t *testing.T) {
	tests := []struct {
		mode             Mode
		controller, node bool
	}{
		{ModeController, true, false},
		{ModeNode, false, true},
		{ModeAll, true, true},
		{"bogus", false, false},
	}
	for _, tc := range tests {
		if tc.mode.Controller() != tc.controller || tc.mode.Node() != tc.node {
			t.Errorf("%q: Controller()=%v Node()=%v, want %v %v", tc.mode, tc.mode.Controller(), tc.mode.Node(), tc.controller, tc.node)
		}
	}
}

func TestSocketPath(t *testing.T) {
	tests := []struct {
		endpoint string
		want     string // empty: an error is expected
	}{
		{"unix:///run/spindle/csi.sock", "/run/spindle/csi.sock"},
		{"unix:/run/spindle/csi.sock", "/run/spindle/csi.sock"},
		{"/csi/csi.sock", "/csi/csi.sock"},
		{"unix:///csi//sub/../csi.sock", "/csi/csi.sock"},
		{"unix:csi.sock", ""},
		{"unix://csi.sock", ""}, // a "host", not a path
		{"csi.sock", ""},
		{"./csi.sock", ""},
		{"tcp://127.0.0.1:10000", ""},
		{"unix://", ""},
		{"unix:", ""},
		{"", ""},
	}
	for _, tc := range tests {
		got, err := SocketPath(tc.endpoint)
		if tc.want == "" {
			if err == nil {
				t.Errorf("SocketPath(%q) = %q, want an error", tc.endpoint, got)
			} else if !strings.Contains(err.Error(), "--endpoint") {
				t.Errorf("SocketPath(%q) error %q does not name --endpoint", tc.endpoint, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("SocketPath(%q) = %q, %v; want %q", tc.endpoint, got, err, tc.want)
		}
	}
}

func TestValidateNodeID(t *testing.T) {
	for _, ok := range []string{"a", "node-1", "ip-10-0-0-1.ec2.internal", "N_1", strings.Repeat("x", 128)} {
		if err := ValidateNodeID(ok); err != nil {
			t.Errorf("ValidateNodeID(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-node", "node-", "node 1", "node/1", "../x", strings.Repeat("x", 129), "nöde"} {
		if err := ValidateNodeID(bad); err == nil {
			t.Errorf("ValidateNodeID(%q) accepted", bad)
		}
	}
}
