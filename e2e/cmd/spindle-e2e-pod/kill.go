package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// killDuring waits until a process named comm runs (its /proc/PID/comm),
// then kills with SIGKILL every process whose command line (arguments
// joined by spaces, with one space before and after) contains pattern,
// and says what it killed. It polls procRoot every few milliseconds, in
// process, so that it catches a program that runs for a fraction of a
// second: a test kills the node plugin in the middle of the stage that
// runs that program.
func killDuring(procRoot, comm, pattern string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if during := findByComm(procRoot, comm); during != 0 {
			var killed []string
			what := strings.TrimSpace(cmdline(procRoot, during))
			for _, pid := range findByCmdline(procRoot, pattern) {
				// Its command line now: a killed process has none.
				line := strings.TrimSpace(cmdline(procRoot, pid))
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					return "", fmt.Errorf("kill %d: %w", pid, err)
				}
				killed = append(killed, fmt.Sprintf("%d (%s)", pid, line))
			}
			if len(killed) == 0 {
				return "", fmt.Errorf("%s runs (pid %d), but no process's command line contains %q", comm, during, pattern)
			}
			return fmt.Sprintf("killed %s during %s %d (%s)", strings.Join(killed, ", "), comm, during, what), nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return "", fmt.Errorf("no %s ran in %v", comm, timeout)
}

// pids are the numeric entries of procRoot.
func pids(procRoot string) []int {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid != os.Getpid() {
			out = append(out, pid)
		}
	}
	return out
}

func findByComm(procRoot, comm string) int {
	for _, pid := range pids(procRoot) {
		data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "comm"))
		if err == nil && string(bytes.TrimSpace(data)) == comm {
			return pid
		}
	}
	return 0
}

func findByCmdline(procRoot, pattern string) []int {
	var out []int
	for _, pid := range pids(procRoot) {
		if strings.Contains(cmdline(procRoot, pid), pattern) {
			out = append(out, pid)
		}
	}
	return out
}

// cmdline is a process's arguments joined by spaces, with a space before
// and after ("" when it has exited or is a kernel thread).
func cmdline(procRoot string, pid int) string {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cmdline"))
	if err != nil || len(data) == 0 {
		return ""
	}
	return " " + strings.ReplaceAll(string(bytes.TrimRight(data, "\x00")), "\x00", " ") + " "
}
