package attachd

import (
	"context"
	"errors"
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
