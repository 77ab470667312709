package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func runCaptured(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestRunRejectsBadOptions(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"bad mode", []string{"--node-id=n1", "--mode=both"}, []string{"invalid options", `--mode="both"`}},
		{"bad log format", []string{"--node-id=n1", "--log-format=xml"}, []string{`--log-format="xml"`}},
		{"bad log level", []string{"--node-id=n1", "--log-level=trace"}, []string{`--log-level="trace"`}},
		{"relative pool dir", []string{"--node-id=n1", "--loop-pool-dir=pools"}, []string{`--loop-pool-dir="pools"`, "absolute"}},
		{"tcp endpoint", []string{"--node-id=n1", "--endpoint=tcp://0.0.0.0:1"}, []string{"--endpoint", "only unix sockets"}},
		{"stray arguments", []string{"--node-id=n1", "serve", "now"}, []string{`unexpected arguments ["serve" "now"]`}},
		{"several problems at once", []string{"--node-id=n1", "--mode=x", "--log-format=y"}, []string{`--mode="x"`, `--log-format="y"`}},
		// The flag package explains and prints the usage.
		{"unknown flag", []string{"--pool-dir=/p"}, []string{"flag provided but not defined: -pool-dir", "-loop-pool-dir"}},
		{"not a number", []string{"--max-volumes-per-node=many"}, []string{`invalid value "many"`, "-max-volumes-per-node"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCaptured(tc.args...)
			if code != 2 {
				t.Errorf("exit code = %d, want 2", code)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not mention %q:\n%s", w, stderr)
				}
			}
			if stdout != "" {
				t.Errorf("stdout = %q, want nothing", stdout)
			}
		})
	}
}

func TestRunVersion(t *testing.T) {
	old := version
	version = "v1.2.3-test"
	t.Cleanup(func() { version = old })
	code, stdout, stderr := runCaptured("--version")
	if code != 0 || stdout != "v1.2.3-test\n" || stderr != "" {
		t.Errorf("--version: code %d, stdout %q, stderr %q; want 0, the version, nothing", code, stdout, stderr)
	}
}

func TestRunHelp(t *testing.T) {
	code, stdout, stderr := runCaptured("-h")
	if code != 0 {
		t.Errorf("-h: exit code %d, want 0", code)
	}
	for _, f := range []string{"-endpoint", "-mode", "-node-id", "-config", "-loop-pool-dir", "-version"} {
		if !strings.Contains(stderr, f) {
			t.Errorf("usage does not list %s:\n%s", f, stderr)
		}
	}
	if stdout != "" {
		t.Errorf("stdout = %q, want nothing", stdout)
	}
}

// catchSIGTERM keeps a SIGTERM the test sends from killing the test binary,
// whatever state run's own signal handling is in: the default action only
// applies while nobody is notified.
func catchSIGTERM(t *testing.T) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM)
	t.Cleanup(func() { signal.Stop(ch) })
}

// startRun runs the driver on a socket and pool in dir and returns the
// socket path and a channel that receives run's exit code. A run still going
// when the test ends (because the test failed) is stopped then.
func startRun(t *testing.T, dir string) (socket string, done <-chan int) {
	t.Helper()
	catchSIGTERM(t)
	socket = filepath.Join(dir, "sock", "csi.sock")
	args := []string{
		"--endpoint=unix://" + socket,
		"--loop-pool-dir=" + filepath.Join(dir, "pool"),
		"--node-id=test-node",
		"--mode=all",
		"--log-level=error",
	}
	code := make(chan int, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		code <- run(args, io.Discard, io.Discard)
	}()
	t.Cleanup(func() {
		select {
		case <-finished:
			return
		default:
		}
		_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
		select {
		case <-finished:
		case <-time.After(60 * time.Second):
			t.Error("run did not stop at the end of the test")
		}
	})
	return socket, code
}

// waitForSocket waits until something accepts connections at path (a stale
// socket file refuses them), or run exits. The bound only keeps a broken
// driver from hanging the test; nothing is measured.
func waitForSocket(t *testing.T, path string, done <-chan int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case code := <-done:
			t.Fatalf("run exited with %d before serving", code)
		default:
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing serves at %s", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func pluginName(t *testing.T, socket string) string {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		t.Fatalf("GetPluginInfo: %v", err)
	}
	return resp.GetName() + " " + resp.GetVendorVersion()
}

// stopRun sends SIGTERM and checks that run stops cleanly and removes its
// socket.
func stopRun(t *testing.T, socket string, done <-chan int) {
	t.Helper()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("run returned %d after SIGTERM, want 0", code)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("run did not return after SIGTERM")
	}
	if _, err := os.Lstat(socket); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket left behind after stop: %v", err)
	}
}

func TestRunServesUntilSIGTERM(t *testing.T) {
	dir := t.TempDir()
	socket, done := startRun(t, dir)
	waitForSocket(t, socket, done)

	st, err := os.Lstat(socket)
	if err != nil {
		t.Fatal(err)
	}
	// Only root may talk to the plugin.
	if perm := st.Mode().Perm(); perm != 0o600 {
		t.Errorf("socket mode = %v, want 0600", perm)
	}
	if got, want := pluginName(t, socket), "spindle.csi.dev "+version; got != want {
		t.Errorf("GetPluginInfo = %q, want %q", got, want)
	}
	stopRun(t, socket, done)
}

// A socket left behind by a killed driver is replaced.
func TestRunReplacesStaleSocket(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "sock", "csi.sock")
	if err := os.MkdirAll(filepath.Dir(stale), 0o750); err != nil {
		t.Fatal(err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false) // leave the file, as a crash would
	l.Close()
	if c, err := net.Dial("unix", stale); err == nil {
		c.Close()
		t.Fatal("test setup: the stale socket accepts connections")
	}

	socket, done := startRun(t, dir)
	if socket != stale {
		t.Fatalf("test setup: socket %s, stale %s", socket, stale)
	}
	waitForSocket(t, socket, done)
	if got := pluginName(t, socket); !strings.HasPrefix(got, "spindle.csi.dev ") {
		t.Errorf("GetPluginInfo on the new socket = %q", got)
	}
	stopRun(t, socket, done)
}

// Anything else at the endpoint path is not ours to remove.
func TestRunRefusesRegularFileAtEndpoint(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sock", "csi.sock")
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}

	// The reason goes to the log, which writes to the process's stderr.
	logs := captureStderr(t, func() {
		_, done := startRun(t, dir)
		select {
		case code := <-done:
			if code != 1 {
				t.Errorf("run returned %d, want 1", code)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("run kept running with a regular file at its endpoint")
		}
	})
	if !strings.Contains(logs, "exists and is not a socket") {
		t.Errorf("the log does not say why:\n%s", logs)
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != "not a socket" {
		t.Errorf("the file at the endpoint was touched: %q, %v", got, err)
	}
}

// captureStderr runs f with os.Stderr redirected to a pipe and returns what
// was written. Tests in this package do not run in parallel, so swapping the
// global is safe here.
func captureStderr(t *testing.T, f func()) (out string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	var buf bytes.Buffer
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(&buf, r); close(copied) }()
	defer func() {
		os.Stderr = old
		w.Close()
		<-copied
		r.Close()
		out = buf.String()
	}()
	f()
	return ""
}
