package driver

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/spindle-csi/spindle/internal/config"
)

// The node plugin registers itself the way kubelet's plugin watcher expects:
// a socket named after the driver in the registry directory, GetInfo with
// the CSI endpoint kubelet must use, and the verdict logged. The socket goes
// away with the plugin, so kubelet deregisters it.
func TestRegistersWithKubelet(t *testing.T) {
	tests := []struct {
		name         string
		kubeletPath  string // --kubelet-registration-path
		wantEndpoint func(socket string) string
		verdict      *registerapi.RegistrationStatus
		wantLog      string
	}{
		{"endpoint as kubelet sees it", "/var/lib/kubelet/plugins/spindle.csi.dev/csi.sock",
			func(string) string { return "/var/lib/kubelet/plugins/spindle.csi.dev/csi.sock" },
			&registerapi.RegistrationStatus{PluginRegistered: true}, "registered with kubelet"},
		{"endpoint defaults to the socket", "",
			func(socket string) string { return socket },
			&registerapi.RegistrationStatus{PluginRegistered: false, Error: "driver name already registered"}, "kubelet refused the plugin registration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			registry := t.TempDir()
			e := newTestEnv(t, func(o *config.Options) {
				o.Mode = config.ModeNode
				o.PluginRegistrationDir = registry
				o.KubeletRegistrationPath = tt.kubeletPath
			})
			socket, _ := config.SocketPath(e.d.opts.Endpoint)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- e.d.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })

			regSocket := filepath.Join(registry, config.DefaultDriverName+"-reg.sock")
			conn, err := grpc.NewClient("unix://"+regSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			watcher := registerapi.NewRegistrationClient(conn)
			info, err := watcher.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
			if err != nil {
				t.Fatalf("GetInfo: %v", err)
			}
			if info.Type != registerapi.CSIPlugin || info.Name != config.DefaultDriverName || info.Endpoint != tt.wantEndpoint(socket) || len(info.SupportedVersions) == 0 {
				t.Fatalf("GetInfo = %+v", info)
			}
			// kubelet's next step: NodeGetInfo on the announced endpoint,
			// which must already serve.
			csiConn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer csiConn.Close()
			if ni, err := csi.NewNodeClient(csiConn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{}); err != nil || ni.GetNodeId() != testNodeID {
				t.Fatalf("NodeGetInfo after GetInfo = %v, %v", ni, err)
			}
			if _, err := watcher.NotifyRegistrationStatus(ctx, tt.verdict); err != nil {
				t.Fatalf("NotifyRegistrationStatus: %v", err)
			}
			if n := e.logs.FilterMessage(tt.wantLog).Len(); n != 1 {
				t.Fatalf("%d %q log lines, want 1", n, tt.wantLog)
			}

			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
			done <- nil
			if _, err := os.Lstat(regSocket); !os.IsNotExist(err) {
				t.Fatalf("registration socket left after Run: %v", err)
			}
		})
	}
}
