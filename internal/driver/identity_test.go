package driver

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/config"
)

func withMode(m config.Mode) func(*config.Options) {
	return func(o *config.Options) { o.Mode = m }
}

func TestGetPluginInfo(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, driverName, version string
		wantVersion               string
	}{
		{"default name", config.DefaultDriverName, testVersion, testVersion},
		{"renamed", "block.example.com", "v0.1.0", "v0.1.0"},
		{"no version", config.DefaultDriverName, "", "unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, func(o *config.Options) { o.DriverName = tt.driverName })
			d, err := newDriver(e.d.opts, tt.version, e.d.instances, defaultKey, e.host, e.d.log)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := call(e, "/csi.v1.Identity/GetPluginInfo", (&identityService{d: d}).GetPluginInfo, &csi.GetPluginInfoRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetName() != tt.driverName || resp.GetVendorVersion() != tt.wantVersion {
				t.Fatalf("GetPluginInfo = %q %q, want %q %q", resp.GetName(), resp.GetVendorVersion(), tt.driverName, tt.wantVersion)
			}
		})
	}
}

func TestGetPluginCapabilities(t *testing.T) {
	t.Parallel()
	tests := []struct {
		mode           config.Mode
		wantController bool
	}{
		{config.ModeController, true},
		{config.ModeAll, true},
		{config.ModeNode, false},
	}
	for _, tt := range tests {
		t.Run(string(tt.mode), func(t *testing.T) {
			e := newTestEnv(t, withMode(tt.mode))
			resp, err := call(e, "/csi.v1.Identity/GetPluginCapabilities", e.is.GetPluginCapabilities, &csi.GetPluginCapabilitiesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			var services []csi.PluginCapability_Service_Type
			online := false
			for _, c := range resp.GetCapabilities() {
				switch {
				case c.GetVolumeExpansion().GetType() == csi.PluginCapability_VolumeExpansion_ONLINE:
					online = true
				case c.GetService() != nil:
					services = append(services, c.GetService().GetType())
				default:
					t.Fatalf("unexpected plugin capability %v", c)
				}
			}
			if !online {
				t.Error("online volume expansion not reported")
			}
			var want []csi.PluginCapability_Service_Type
			if tt.wantController {
				want = []csi.PluginCapability_Service_Type{csi.PluginCapability_Service_CONTROLLER_SERVICE}
			}
			if !slices.Equal(services, want) {
				t.Fatalf("mode %s: services %v, want %v", tt.mode, services, want)
			}
		})
	}
}

func TestNodeGetCapabilities(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, withMode(config.ModeNode))
	resp, err := call(e, "/csi.v1.Node/NodeGetCapabilities", e.ns.NodeGetCapabilities, &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []csi.NodeServiceCapability_RPC_Type
	for _, c := range resp.GetCapabilities() {
		got = append(got, c.GetRpc().GetType())
	}
	want := []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH,
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("node capabilities = %v, want exactly %v", got, want)
	}
}

func TestNodeGetInfo(t *testing.T) {
	t.Parallel()
	tests := []struct {
		nodeID string
		max    int64
	}{
		{"node-a", testMaxVolumes},
		{"worker-7.example.com", 0},
	}
	for _, tt := range tests {
		t.Run(tt.nodeID, func(t *testing.T) {
			e := newTestEnv(t, withMode(config.ModeNode), func(o *config.Options) { o.NodeID, o.MaxVolumesPerNode = tt.nodeID, tt.max })
			resp, err := call(e, "/csi.v1.Node/NodeGetInfo", e.ns.NodeGetInfo, &csi.NodeGetInfoRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetNodeId() != tt.nodeID || resp.GetMaxVolumesPerNode() != tt.max {
				t.Fatalf("NodeGetInfo = %q max %d, want %q max %d", resp.GetNodeId(), resp.GetMaxVolumesPerNode(), tt.nodeID, tt.max)
			}
			if resp.GetAccessibleTopology() != nil {
				t.Fatalf("topology %v reported for a shared pool", resp.GetAccessibleTopology())
			}
		})
	}
}

func TestProbe(t *testing.T) {
	t.Parallel()
	breakages := []struct {
		name  string
		apply func(t *testing.T, dir string)
	}{
		{"healthy", nil},
		{"pool removed", func(t *testing.T, dir string) {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
		}},
		{"pool replaced by a file", func(t *testing.T, dir string) {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dir, []byte("not a pool\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	}
	modes := []struct {
		mode config.Mode
		want string // how a broken pool is reported
	}{
		{config.ModeController, "not reachable from the controller"},
		{config.ModeNode, "not usable on node " + testNodeID},
		{config.ModeAll, "not reachable from the controller"},
	}
	for _, m := range modes {
		for _, b := range breakages {
			t.Run(string(m.mode)+"/"+b.name, func(t *testing.T) {
				e := newTestEnv(t, withMode(m.mode))
				if b.apply != nil {
					b.apply(t, e.pools[fastKey].Dir())
				}
				resp, err := e.Probe()
				if b.apply == nil {
					if err != nil {
						t.Fatalf("Probe: %v", err)
					}
					if !resp.GetReady().GetValue() {
						t.Fatalf("Probe of healthy backends: ready = %v", resp.GetReady())
					}
					return
				}
				wantCode(t, err, codes.FailedPrecondition, "backend "+fastKey, m.want, e.pools[fastKey].Dir())
				if resp.GetReady().GetValue() {
					t.Fatal("ready with a broken backend")
				}
			})
		}
	}
}

// fakeAttachDaemon is the attach daemon as the node plugin's health sees it.
type fakeAttachDaemon struct{ err error }

func (f fakeAttachDaemon) Check(context.Context, ...string) error { return f.err }
func (fakeAttachDaemon) Dir() string                              { return "/run/spindle/attachd" }

// NodeGetStorageHealth names an attach daemon that does not answer; one
// that answers, or none configured, adds nothing.
func TestNodeGetStorageHealthReportsTheAttachDaemon(t *testing.T) {
	t.Parallel()
	down := errors.New("the attach daemon at /run/spindle/attachd/attachd.sock does not answer: connection refused")
	for _, tt := range []struct {
		name   string
		daemon command.DaemonHost
		want   bool
	}{
		{"none configured", nil, false},
		{"answers", fakeAttachDaemon{}, false},
		{"does not answer", fakeAttachDaemon{err: down}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, withMode(config.ModeNode))
			e.d.attachDaemon = tt.daemon
			resp, err := e.ns.NodeGetStorageHealth(context.Background(), &csi.NodeGetStorageHealthRequest{})
			if err != nil {
				t.Fatal(err)
			}
			var found []string
			for _, h := range resp.GetBackendHealth() {
				if h.GetReason() == "AttachDaemonUnreachable" {
					found = append(found, h.GetMessage())
					if h.GetStatus() != csi.StorageHealthErrorType_STORAGE_UNREACHABLE || !strings.Contains(h.GetMessage(), down.Error()) {
						t.Errorf("entry %v: want STORAGE_UNREACHABLE with the daemon's error", h)
					}
				}
			}
			if (len(found) > 0) != tt.want {
				t.Errorf("attach daemon entries %q, want one: %v", found, tt.want)
			}
		})
	}
}
