package driver

import (
	"context"
	"errors"
	_ "github.com/spindle-csi/spindle/internal/backend/all"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/spindle-csi/spindle/internal/config"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/node"
)

// The listenUnix and Run tests are not parallel: creating the socket
// changes the process-wide umask for a moment.

func currentUmask() int {
	old := syscall.Umask(0o022)
	syscall.Umask(old)
	return old
}

func closeOnCleanup(t *testing.T, lis net.Listener) {
	t.Cleanup(func() { lis.Close() })
}

func canDial(path string) bool {
	c, err := net.Dial("unix", path)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func TestListenUnixCreatesPrivateSocket(t *testing.T) {
	umask := currentUmask()
	path := filepath.Join(t.TempDir(), "new", "dir", "csi.sock")
	lis, err := listenUnix(path)
	if err != nil {
		t.Fatalf("listenUnix: %v", err)
	}
	closeOnCleanup(t, lis)
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want a socket with 0600", st.Mode())
	}
	if !canDial(path) {
		t.Fatal("cannot connect to the new socket")
	}
	if got := currentUmask(); got != umask {
		t.Fatalf("umask %o after listenUnix, was %o", got, umask)
	}
}

func TestListenUnixReplacesStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "csi.sock")
	old, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	old.(*net.UnixListener).SetUnlinkOnClose(false)
	old.Close() // a crashed plugin leaves its socket behind
	if canDial(path) {
		t.Fatal("stale socket still accepts connections")
	}

	lis, err := listenUnix(path)
	if err != nil {
		t.Fatalf("listenUnix over a stale socket: %v", err)
	}
	closeOnCleanup(t, lis)
	if !canDial(path) {
		t.Fatal("cannot connect to the new socket")
	}
	if st, err := os.Lstat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v, %v", st, err)
	}
}

// A socket another plugin still serves on is not stale: listenUnix must not
// take it over, and the other plugin keeps working.
func TestListenUnixRefusesLiveSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "csi.sock")
	live, err := listenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	closeOnCleanup(t, live)
	go func() {
		for {
			conn, err := live.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()

	if lis, err := listenUnix(path); err == nil {
		lis.Close()
		t.Fatal("listenUnix took over a live socket")
	} else if !strings.Contains(err.Error(), "another running process") {
		t.Fatalf("error %q does not say the socket is in use", err)
	}
	if !canDial(path) {
		t.Fatal("the live socket no longer accepts connections")
	}
}

func TestListenUnixRefusesOtherFiles(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, path string)
		check func(t *testing.T, path string)
	}{
		{
			name:  "regular file",
			setup: func(t *testing.T, path string) { writeFile(t, path, "keep me\n") },
			check: func(t *testing.T, path string) { fileUnchanged(t, path, []byte("keep me\n")) },
		},
		{
			name: "directory",
			setup: func(t *testing.T, path string) {
				if err := os.Mkdir(path, 0o750); err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(path, "inside"), "data")
			},
			check: func(t *testing.T, path string) { fileUnchanged(t, filepath.Join(path, "inside"), []byte("data")) },
		},
		{
			name: "symlink to a file",
			setup: func(t *testing.T, path string) {
				writeFile(t, path+".target", "target")
				if err := os.Symlink(path+".target", path); err != nil {
					t.Fatal(err)
				}
			},
			check: func(t *testing.T, path string) {
				if dest, err := os.Readlink(path); err != nil || dest != path+".target" {
					t.Fatalf("symlink changed: %q, %v", dest, err)
				}
				fileUnchanged(t, path+".target", []byte("target"))
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "csi.sock")
			tt.setup(t, path)
			lis, err := listenUnix(path)
			if err == nil {
				lis.Close()
				t.Fatal("listenUnix replaced something that is not a socket")
			}
			if !strings.Contains(err.Error(), "not a socket") || !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q should name the path and say it is not a socket", err)
			}
			tt.check(t, path)
		})
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	base := func(t *testing.T) config.Options {
		return config.Options{
			Endpoint: "unix:///run/spindle-test/csi.sock", Mode: config.ModeAll, NodeID: "node-a",
			DriverName: config.DefaultDriverName, LoopPoolDir: filepath.Join(t.TempDir(), "pool"),
			LogFormat: "json", LogLevel: "info", KubeletDir: filepath.Join(t.TempDir(), "kubelet"),
		}
	}

	t.Run("default loop instance", func(t *testing.T) {
		opts := base(t)
		d, err := New(opts, "", zap.NewNop())
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if d.version != "unknown" || d.ctrl.DefaultInstance() != "loop/default" || !slices.Equal(d.instances.Keys(), []string{"loop/default"}) {
			t.Fatalf("driver version %q, default %q, instances %v", d.version, d.ctrl.DefaultInstance(), d.instances.Keys())
		}
		if st, err := os.Stat(opts.LoopPoolDir); err != nil || !st.IsDir() {
			t.Fatalf("pool directory not created: %v", err)
		}
	})

	t.Run("config file", func(t *testing.T) {
		dir := t.TempDir()
		cfg := filepath.Join(dir, "config.yaml")
		writeFile(t, cfg, "defaultBackend: loop/fast\nbackends:\n"+
			"  - {type: loop, name: default, loop: {poolDir: "+filepath.Join(dir, "a")+"}}\n"+
			"  - {type: loop, name: fast, loop: {poolDir: "+filepath.Join(dir, "b")+"}}\n")
		opts := base(t)
		opts.ConfigFile = cfg
		d, err := New(opts, "v9", zap.NewNop())
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if d.version != "v9" || d.ctrl.DefaultInstance() != "loop/fast" || !slices.Equal(d.instances.Keys(), []string{"loop/default", "loop/fast"}) {
			t.Fatalf("driver version %q, default %q, instances %v", d.version, d.ctrl.DefaultInstance(), d.instances.Keys())
		}
	})

	// An iscsi instance whose tgtd is down: the controller still starts
	// (Probe says what is wrong) and warns that it could not repair the
	// exports (backend.Reconciler).
	t.Run("iscsi instance with its target host down", func(t *testing.T) {
		dir := t.TempDir()
		cfg := filepath.Join(dir, "config.yaml")
		writeFile(t, cfg, "backends:\n  - type: iscsi\n    name: san\n    iscsi:\n"+
			"      poolDir: "+filepath.Join(dir, "pool")+"\n      portals: [\"127.0.0.1:3260\"]\n"+
			"      tgtControlSocket: "+filepath.Join(dir, "no-tgtd.socket")+"\n"+
			"      targetPrefix: iqn.2026-01.dev.spindle\n      initiatorPrefix: iqn.2026-01.dev.spindle.node\n")
		opts := base(t)
		opts.ConfigFile = cfg
		core, logs := observer.New(zap.WarnLevel)
		d, err := New(opts, "v1", zap.New(core))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if d.ctrl.DefaultInstance() != "iscsi/san" {
			t.Fatalf("default instance %q", d.ctrl.DefaultInstance())
		}
		w := logs.FilterMessageSnippet("could not repair backend state").All()
		if len(w) != 1 || w[0].ContextMap()["backend"] != "iscsi/san" {
			t.Fatalf("warnings %v, want one about repairing iscsi/san", logs.All())
		}
	})

	errTests := []struct {
		name   string
		mutate func(*config.Options)
		want   string
	}{
		{"bad mode", func(o *config.Options) { o.Mode = "both" }, "--mode"},
		{"bad node ID", func(o *config.Options) { o.NodeID = "a/b" }, "--node-id"},
		{"relative pool", func(o *config.Options) { o.LoopPoolDir = "pool" }, "--loop-pool-dir"},
		{"missing config file", func(o *config.Options) { o.ConfigFile = "/nonexistent/spindle.yaml" }, "read config"},
	}
	for _, tt := range errTests {
		t.Run(tt.name, func(t *testing.T) {
			opts := base(t)
			tt.mutate(&opts)
			d, err := New(opts, "v1", zap.NewNop())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New = %v, %v; want an error about %s", d, err, tt.want)
			}
		})
	}
}

// Run serves the services of its mode on the socket, registers a node
// plugin with its backends, and stops cleanly when its context ends.
func TestRun(t *testing.T) {
	tests := []struct {
		mode                     config.Mode
		wantController, wantNode bool
	}{
		{config.ModeController, true, false},
		{config.ModeNode, false, true},
		{config.ModeAll, true, true},
	}
	for _, tt := range tests {
		t.Run(string(tt.mode), func(t *testing.T) {
			e := newTestEnv(t, withMode(tt.mode))
			socket, err := config.SocketPath(e.d.opts.Endpoint)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			done := make(chan error, 1)
			go func() { done <- e.d.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				<-done
			})

			conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}, grpc.WaitForReady(true))
			if err != nil {
				t.Fatalf("GetPluginInfo: %v", err)
			}
			if info.GetName() != config.DefaultDriverName || info.GetVendorVersion() != testVersion {
				t.Fatalf("GetPluginInfo = %v", info)
			}
			if st, err := os.Lstat(socket); err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("socket: %v, %v", st, err)
			}

			_, err = csi.NewControllerClient(conn).ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
			wantCode(t, err, map[bool]codes.Code{true: codes.OK, false: codes.Unimplemented}[tt.wantController])
			nodeInfo, err := csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
			wantCode(t, err, map[bool]codes.Code{true: codes.OK, false: codes.Unimplemented}[tt.wantNode])
			if tt.wantNode && nodeInfo.GetNodeId() != testNodeID {
				t.Fatalf("NodeGetInfo = %v", nodeInfo)
			}
			// Errors cross the wire with their codes.
			_, err = csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
			wantCode(t, err, codes.OK)

			// A node plugin announced itself to every backend instance.
			for _, key := range []string{defaultKey, fastKey} {
				_, err := os.Stat(filepath.Join(e.pools[key].Dir(), ".nodes", testNodeID+".json"))
				if registered := err == nil; registered != tt.wantNode {
					t.Fatalf("%s: node registered = %t, want %t", key, registered, tt.wantNode)
				}
			}

			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Run returned %v after its context ended", err)
			}
			done <- nil // for the cleanup
			if _, err := os.Lstat(socket); !os.IsNotExist(err) {
				t.Fatalf("socket left after Run: %v", err)
			}
			if n := e.logs.FilterMessage("stopped").Len(); n != 1 {
				t.Fatalf("%d \"stopped\" log lines, want 1", n)
			}
		})
	}
}

// A node plugin starting after a reboot forgets the stage records the
// earlier boot left (kubelet may never unstage them: a power cut can take
// its own record of the volume), before it serves; this boot's stay.
func TestRunForgetsStageRecordsOfEarlierBoots(t *testing.T) {
	e := newTestEnv(t, withMode(config.ModeNode))
	csiDir := filepath.Join(e.kubelet, "plugins", "kubernetes.io", "csi", config.DefaultDriverName)
	earlier, current := filepath.Join(csiDir, "0aa", "globalmount"), filepath.Join(csiDir, "0bb", "globalmount")
	for _, p := range []string{earlier, current} {
		if err := e.host.MakeDir(p); err != nil {
			t.Fatal(err)
		}
	}
	old := `{"version":1,"volumeID":"loop/default/pvc-earlier","device":"/dev/loop0","accessType":"mount","fsType":"ext4","stagedAt":"2026-11-25T18:19:10Z","bootID":"an-earlier-boot"}`
	e.host.WriteEntry(node.StageRecordPath(earlier), 0, []byte(old))
	if err := e.host.WriteStageRecord(current, node.StageRecord{VolumeID: "loop/default/pvc-current", Device: "/dev/loop1", AccessType: "mount"}); err != nil {
		t.Fatal(err)
	}

	socket, err := config.SocketPath(e.d.opts.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("GetPluginInfo: %v", err)
	}

	if _, err := e.host.StageRecord(earlier); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the earlier boot's record: %v, want it gone", err)
	}
	if !e.host.Exists(earlier) {
		t.Error("the staging directory is kubelet's and must stay")
	}
	if rec, err := e.host.StageRecord(current); err != nil || rec.VolumeID != "loop/default/pvc-current" {
		t.Errorf("this boot's record = %+v, %v; want it kept", rec, err)
	}
	logged := e.logs.FilterMessageSnippet("forgot a stage record from an earlier boot").All()
	if len(logged) != 1 || logged[0].ContextMap()["volumeID"] != "loop/default/pvc-earlier" {
		t.Errorf("log lines about forgotten records: %+v; want one naming loop/default/pvc-earlier", logged)
	}

	// Then, serving, it looks at the rest and says what it found: this
	// boot's record names a device that is not attached.
	deadline := time.Now().Add(10 * time.Second)
	for e.logs.FilterMessage("start-up reconcile done").Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no \"start-up reconcile done\" log line 10 s after the plugin served")
		}
		time.Sleep(10 * time.Millisecond)
	}
	summary := e.logs.FilterMessage("start-up reconcile done").All()[0].ContextMap()
	if summary["staged"] != int64(1) || summary["notWhole"] != int64(1) {
		t.Errorf("start-up reconcile: %v; want 1 staged, not whole", summary)
	}
	notWhole := e.logs.FilterMessageSnippet("not whole").All()
	if len(notWhole) != 1 || notWhole[0].ContextMap()["volumeID"] != "loop/default/pvc-current" || notWhole[0].ContextMap()["deviceState"] != "missing" {
		t.Errorf("volumes reported not whole: %+v; want loop/default/pvc-current, its device missing", notWhole)
	}
	if !e.host.Exists(node.StageRecordPath(current)) {
		t.Error("the reconcile removed the record of a volume that is not whole; it must leave it to kubelet")
	}
}
