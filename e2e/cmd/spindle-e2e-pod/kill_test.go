package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// start runs a process for the test and reaps it at the end.
func start(t *testing.T, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

func TestKillDuring(t *testing.T) {
	// The program to wait for: sleep under a name nothing else has (a
	// process's comm is its file's name).
	sleepPath, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("no sleep: %v", err)
	}
	data, err := os.ReadFile(sleepPath)
	if err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(t.TempDir(), "e2e-kill-prog")
	if err := os.WriteFile(prog, data, 0o755); err != nil {
		t.Fatal(err)
	}
	// The process to kill: a shell whose command line carries a marker
	// (it waits on its own child, so it is still there to be killed).
	target := start(t, "sh", "-c", "sleep 60; : --mode=e2e-kill-target", "sh")

	if _, err := killDuring("/proc", "e2e-kill-prog", " --mode=e2e-kill-target", 50*time.Millisecond); err == nil ||
		!strings.Contains(err.Error(), "no e2e-kill-prog ran") {
		t.Fatalf("killDuring before the program runs: %v, want 'no e2e-kill-prog ran'", err)
	}
	// The program starts a little later and runs briefly: it is caught.
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = exec.Command(prog, "0.3").Run()
	}()
	msg, err := killDuring("/proc", "e2e-kill-prog", " --mode=e2e-kill-target", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(msg, "killed ") || !strings.Contains(msg, ": --mode=e2e-kill-target") || !strings.Contains(msg, " during e2e-kill-prog ") {
		t.Errorf("report %q", msg)
	}
	err = target.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ProcessState.String() != "signal: killed" {
		t.Errorf("the target ended with %v, want killed", err)
	}
	// A pattern nothing matches is an error, not a success.
	go func() { _ = exec.Command(prog, "0.3").Run() }()
	if _, err := killDuring("/proc", "e2e-kill-prog", " --mode=e2e-nothing-has-this ", 5*time.Second); err == nil ||
		!strings.Contains(err.Error(), "no process's command line contains") {
		t.Errorf("killDuring with a pattern nothing has: %v", err)
	}
}
