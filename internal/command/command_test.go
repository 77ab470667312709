package command_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
	utilexec "k8s.io/utils/exec"
)

func TestRunReportsExitCodeAndStderr(t *testing.T) {
	script := commandtest.New(t,
		commandtest.Expect("blkid", "-p", "/dev/loop9").Exits(2, ""),
		commandtest.Expect("mkfs.ext4", "/dev/loop9").Exits(1, "mke2fs: Device size reported to be zero."),
	)
	var seen []command.Observation
	r := command.New(script, func(o command.Observation) { seen = append(seen, o) })

	_, err := r.Run(context.Background(), "blkid", "-p", "/dev/loop9")
	if got := command.ExitCode(err); got != 2 {
		t.Fatalf("exit code = %d, want 2 (err %v)", got, err)
	}
	_, err = r.Run(context.Background(), "mkfs.ext4", "/dev/loop9")
	if err == nil || !strings.Contains(err.Error(), "Device size reported to be zero") || !strings.Contains(err.Error(), "mkfs.ext4 /dev/loop9") {
		t.Fatalf("error should name the command and carry stderr, got %v", err)
	}
	if len(seen) != 2 || seen[1].ExitCode != 1 || seen[0].Name != "blkid" {
		t.Fatalf("observations = %+v", seen)
	}
}

func TestSecretArgsAreHidden(t *testing.T) {
	script := commandtest.New(t, commandtest.Expect("tool", "--key", "s3cret").Exits(1, "denied"))
	var seen command.Observation
	r := command.New(script, func(o command.Observation) { seen = o })
	_, err := r.Exec(context.Background(), command.Cmd{Name: "tool", Args: []string{"--key", "s3cret"}, SecretArgs: true})
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("error must not show secret arguments: %v", err)
	}
	if seen.Args != nil {
		t.Fatalf("observation must not carry secret arguments: %v", seen.Args)
	}
}

// The real executor: locale forced to C, the deadline kills a hung program.
func TestRealCommandLocaleAndDeadline(t *testing.T) {
	t.Setenv("LANG", "de_DE.UTF-8")
	t.Setenv("LC_MESSAGES", "de_DE.UTF-8")
	r := command.New(utilexec.New(), nil)
	out, err := r.Run(context.Background(), "sh", "-c", "echo $LC_ALL:$LANG:$LC_MESSAGES")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != "C::" {
		t.Fatalf("locale environment = %q, want %q", got, "C::")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = r.Run(ctx, "sleep", "30")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a hung command must fail with the deadline, got %v", err)
	}
	if command.ExitCode(err) != -1 {
		t.Fatalf("a killed command has no exit code, got %d", command.ExitCode(err))
	}

	_, err = r.Run(context.Background(), "/nonexistent/tool")
	if err == nil || command.ExitCode(err) != -1 {
		t.Fatalf("a missing program must fail without an exit code, got %v", err)
	}
	if _, statErr := os.Stat("/nonexistent/tool"); statErr == nil {
		t.Skip("unexpected /nonexistent/tool")
	}
}

func TestStdinIsEmptyNotInherited(t *testing.T) {
	r := command.New(utilexec.New(), nil)
	out, err := r.Run(context.Background(), "sh", "-c", "cat; echo done")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(out)) != "done" {
		t.Fatalf("stdin must be empty, got %q", out)
	}
}

// Cmd.Env adds variables, and LC_ALL=C still wins over one that names LC_ALL.
func TestEnvAddsVariablesButNotLocale(t *testing.T) {
	r := command.New(utilexec.New(), nil)
	out, err := r.Exec(context.Background(), command.Cmd{
		Name: "sh", Args: []string{"-c", "echo $TGT_IPC_SOCKET:$LC_ALL"},
		Env: []string{"TGT_IPC_SOCKET=/run/x/tgtd.socket", "LC_ALL=de_DE.UTF-8"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != "/run/x/tgtd.socket:C" {
		t.Fatalf("environment = %q, want %q", got, "/run/x/tgtd.socket:C")
	}
}

func TestEnvIsPerCommand(t *testing.T) {
	r := command.New(utilexec.New(), nil)
	out, err := r.Exec(context.Background(), command.Cmd{Name: "sh", Args: []string{"-c", "echo $SPINDLE_TEST_VAR:$LC_ALL"}, Env: []string{"SPINDLE_TEST_VAR=one"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != "one:C" {
		t.Fatalf("with Env, the command saw %q, want %q", got, "one:C")
	}
	// The next command does not inherit it.
	out, err = r.Run(context.Background(), "sh", "-c", "echo $SPINDLE_TEST_VAR:$LC_ALL")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != ":C" {
		t.Fatalf("the next command saw %q, want %q", got, ":C")
	}
}

// An argument list the kernel refuses (E2BIG) is said to be that, not
// "executable file not found", which is how execve's E2BIG reaches us
// through k8s.io/utils/exec; the real program and the kernel agree.
func TestArgumentListTooLong(t *testing.T) {
	r := command.New(utilexec.New(), nil)
	huge := strings.Repeat("x", 1<<20)
	_, err := r.Run(context.Background(), "true", "-E", huge)
	if err == nil || !strings.Contains(err.Error(), "argument list too long (E2BIG): argument 2 is 1048576 bytes") {
		t.Fatalf("Run with a 1 MiB argument = %v, want E2BIG naming the argument", err)
	}
	if strings.Contains(err.Error(), huge[:1000]) {
		t.Fatal("the error repeats the argument")
	}
	// Within the limits the same program runs.
	if _, err := r.Run(context.Background(), "true", strings.Repeat("x", 100<<10)); err != nil {
		t.Fatalf("a 100 KiB argument: %v", err)
	}
	many := make([]string, 0, 40000)
	for range 40000 {
		many = append(many, strings.Repeat("y", 100))
	}
	if _, err := r.Run(context.Background(), "true", many...); err == nil || !strings.Contains(err.Error(), "E2BIG") {
		t.Fatalf("4 MB of arguments = %v, want E2BIG", err)
	}
}

// fakeDaemonHost is an attach daemon as the runner sees it.
type fakeDaemonHost struct {
	dir     string
	checked []string
	err     error
}

func (h *fakeDaemonHost) Check(_ context.Context, programs ...string) error {
	h.checked = append(h.checked, programs...)
	return h.err
}
func (h *fakeDaemonHost) Dir() string { return h.dir }

func TestDaemons(t *testing.T) {
	ctx := context.Background()
	local := command.New(utilexec.New(), nil)
	if local.Daemons() != local || local.DaemonsDir() != "" {
		t.Fatalf("a runner without an attach daemon runs its daemons itself: Daemons %p (runner %p), DaemonsDir %q", local.Daemons(), local, local.DaemonsDir())
	}
	if err := local.CheckDaemons(ctx, "sh"); err != nil {
		t.Errorf("CheckDaemons(sh) here = %v", err)
	}
	if err := local.CheckDaemons(ctx, "sh", "spindle-no-such-program"); err == nil || !strings.Contains(err.Error(), "spindle-no-such-program not found") {
		t.Errorf("CheckDaemons of a missing program = %v, want it named", err)
	}

	host := &fakeDaemonHost{dir: "/run/spindle/attachd"}
	remote := command.New(utilexec.New(), nil)
	r := local.WithDaemons(remote, host)
	if r.Daemons() != remote || r.DaemonsDir() != host.dir || local.Daemons() != local {
		t.Fatalf("WithDaemons: Daemons %p (want %p), DaemonsDir %q; the original runner changed: %v", r.Daemons(), remote, r.DaemonsDir(), local.Daemons() != local)
	}
	if err := r.CheckDaemons(ctx, "rbd-fuse"); err != nil || len(host.checked) != 1 || host.checked[0] != "rbd-fuse" {
		t.Errorf("CheckDaemons asked the host about %v: %v", host.checked, err)
	}
	host.err = errors.New("the attach daemon does not answer")
	if err := r.CheckDaemons(ctx, "rbd-fuse"); !errors.Is(err, host.err) {
		t.Errorf("CheckDaemons = %v, want the host's answer", err)
	}
}
