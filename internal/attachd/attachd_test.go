package attachd

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/command"
)

// serve runs a daemon that may also run sh, and a Runner that uses it.
func serve(t *testing.T) *command.Runner {
	t.Helper()
	return command.New(serveClient(t, "sh"), nil)
}

// serveClient runs a daemon that may also run extra, and a client of it.
func serveClient(t *testing.T, extra ...string) *Client {
	t.Helper()
	saved := Programs
	Programs = append(append([]string{}, saved...), extra...)
	t.Cleanup(func() { Programs = saved })
	socket := filepath.Join(t.TempDir(), "attachd.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&Server{Socket: socket, Log: zaptest.NewLogger(t)}).Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	c := NewClient(socket)
	deadline := time.Now().Add(5 * time.Second)
	for c.Healthy(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the daemon never answered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st, err := os.Stat(socket); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v, %v; want mode 0600", st, err)
	}
	return c
}

func TestCommandsRunInTheDaemon(t *testing.T) {
	run := serve(t)
	ctx := context.Background()

	out, err := run.Run(ctx, "sh", "-c", "echo out; echo err >&2; exit 3")
	if command.ExitCode(err) != 3 || command.Stderr(err) != "err" || string(out) != "out\n" {
		t.Fatalf("exit 3 = %q, %v (code %d, stderr %q)", out, err, command.ExitCode(err), command.Stderr(err))
	}
	// The runner's environment (LC_ALL=C) and stdin reach the program.
	out, err = run.Exec(ctx, command.Cmd{Name: "sh", Args: []string{"-c", "echo $LC_ALL; cat"}, Stdin: []byte("from stdin")})
	if err != nil || string(out) != "C\nfrom stdin" {
		t.Fatalf("env and stdin: %q, %v", out, err)
	}
	// Only the daemons' programs.
	if _, err := run.Run(ctx, "rm", "-rf", "/nothing"); err == nil || !strings.Contains(err.Error(), "runs only rbd-fuse, rbd-nbd, qemu-storage-daemon") {
		t.Fatalf("rm = %v, want a refusal naming the programs it runs", err)
	}
	// The caller's deadline holds in the daemon.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := run.Run(short, "sh", "-c", "sleep 5"); err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("sleep 5 with a 300 ms deadline = %v after %s", err, time.Since(start))
	}
}

func TestMissingProgram(t *testing.T) {
	err := serveClient(t, "spindle-no-such-program").Command("spindle-no-such-program").Run()
	if !errors.Is(err, utilexec.ErrExecutableNotFound) {
		t.Fatalf("a missing program = %v, want ErrExecutableNotFound", err)
	}
}

// A program that leaves a daemon behind returns at once, and its daemon
// outlives the request and the serving: it is the volume's.
func TestDaemonsOutliveTheRequest(t *testing.T) {
	run := serve(t)
	out, err := run.Run(context.Background(), "sh", "-c", "sleep 60 & echo $!")
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("pid %q: %v", out, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the daemon %d is gone after its request: %v", pid, err)
	}
}

func TestCheck(t *testing.T) {
	c := serveClient(t, "sh", "spindle-no-such-program")
	ctx := context.Background()
	if err := c.Check(ctx); err != nil {
		t.Fatalf("Check() of a daemon in this PID namespace = %v", err)
	}
	if err := c.Check(ctx, "sh"); err != nil {
		t.Fatalf("Check(sh) = %v", err)
	}
	for _, p := range []string{"spindle-no-such-program", "rm"} {
		err := c.Check(ctx, "sh", p)
		if err == nil || !strings.Contains(err.Error(), "cannot run "+p) {
			t.Errorf("Check(sh, %s) = %v, want it to name %s as what the daemon cannot run", p, err, p)
		}
	}
	if got, want := c.Dir(), filepath.Dir(c.socket); got != want {
		t.Errorf("Dir() = %q, want the socket's directory %q", got, want)
	}
}

// A daemon that does not share the node plugin's PID namespace, or that is
// not there, is reported as such.
func TestCheckRefuses(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "attachd.sock")
	c := NewClient(socket)
	if err := c.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "does not answer") {
		t.Fatalf("Check() without a daemon = %v, want \"does not answer\"", err)
	}
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(Health{PIDNamespace: "pid:[1]"})
	})}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
	err = c.Check(context.Background())
	if err == nil || !strings.Contains(err.Error(), "another PID namespace (pid:[1])") || !strings.Contains(err.Error(), "hostPID") {
		t.Fatalf("Check() of a daemon in another PID namespace = %v", err)
	}
}

// A command runs to its end when the node plugin that asked for it goes
// away in the middle: a daemon is never killed half-way through its start.
func TestCommandOutlivesItsClient(t *testing.T) {
	run := serve(t)
	done := filepath.Join(t.TempDir(), "done")
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(200 * time.Millisecond); cancel() }()
	_, err := run.Run(ctx, "sh", "-c", "sleep 1; echo started > "+done)
	if err == nil {
		t.Fatal("the cancelled request reported success")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, err := os.ReadFile(done); err == nil && string(b) == "started\n" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the command stopped when its client went away")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
