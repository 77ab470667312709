// Package commandtest scripts external commands for tests: a test lists the
// exact commands it expects, in order, with what each prints and how it
// exits, and the Script fails the test on any command out of order, any
// argument that differs, any command run without a deadline or without
// LC_ALL=C, and any expected command that never ran. It is built on
// k8s.io/utils/exec/testing's FakeExec.
package commandtest

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"

	utilexec "k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"
)

// Step is one expected command and its scripted result.
type Step struct {
	name     string
	args     []string
	stdout   string
	stderr   string
	exitCode int
	err      error
	stdin    *string
	effect   func()
	// check, when set, judges the arguments instead of an exact match.
	check func(args []string) error
}

// Expect starts a step for the exact command line name args...
func Expect(name string, args ...string) *Step {
	return &Step{name: name, args: args}
}

// ExpectMatching starts a step for a command name whose arguments check
// accepts: a command line that holds something made fresh for each run
// (a temporary file's name).
func ExpectMatching(name string, check func(args []string) error) *Step {
	return &Step{name: name, check: check}
}

// Prints sets what the command writes to stdout.
func (s *Step) Prints(stdout string) *Step { s.stdout = stdout; return s }

// Exits makes the command exit with code and print stderr.
func (s *Step) Exits(code int, stderr string) *Step {
	s.exitCode, s.stderr = code, stderr
	return s
}

// Reads makes the step check that the command is fed exactly stdin (a
// credential handed over on stdin rather than on the command line).
func (s *Step) Reads(stdin string) *Step { s.stdin = &stdin; return s }

// Does runs effect when the command runs: what the real command changes
// besides its output (modprobe making /sys/module/nbd appear).
func (s *Step) Does(effect func()) *Step { s.effect = effect; return s }

// FailsToStart makes the command fail as if it could not be run at all.
func (s *Step) FailsToStart(err error) *Step { s.err = err; return s }

func (s *Step) String() string { return strings.Join(append([]string{s.name}, s.args...), " ") }

// Script is a utilexec.Interface that plays the steps in order.
type Script struct {
	t     testing.TB
	steps []*Step
	fake  *testingexec.FakeExec

	mu  sync.Mutex
	ran []string
}

var _ utilexec.Interface = (*Script)(nil)

// New returns a Script that expects exactly steps, in order. At the end of
// the test it fails if any step did not run.
func New(t testing.TB, steps ...*Step) *Script {
	t.Helper()
	s := &Script{t: t, steps: steps, fake: &testingexec.FakeExec{}}
	for i := range steps {
		s.fake.CommandScript = append(s.fake.CommandScript, s.action(i))
	}
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if n := len(s.ran); n < len(s.steps) {
			var missing []string
			for _, st := range s.steps[n:] {
				missing = append(missing, st.String())
			}
			t.Errorf("commands expected but never run:\n  %s\nran:\n  %s", strings.Join(missing, "\n  "), strings.Join(s.ran, "\n  "))
		}
	})
	return s
}

// Ran returns the command lines run so far.
func (s *Script) Ran() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ran)
}

func (s *Script) action(i int) testingexec.FakeCommandAction {
	return func(name string, args ...string) utilexec.Cmd {
		st := s.steps[i]
		got := strings.Join(append([]string{name}, args...), " ")
		if st.check != nil && name == st.name {
			if err := st.check(args); err != nil {
				s.t.Errorf("command #%d: %s: %v", i+1, got, err)
				return s.failing(name, args, fmt.Errorf("commandtest: unexpected command %q", got))
			}
		} else if name != st.name || !slices.Equal(args, st.args) {
			s.t.Errorf("command #%d:\n  got  %s\n  want %s", i+1, got, st)
			return s.failing(name, args, fmt.Errorf("commandtest: unexpected command %q", got))
		}
		cmd := &testingexec.FakeCmd{}
		cmd.RunScript = []testingexec.FakeAction{func() ([]byte, []byte, error) {
			if !slices.Contains(cmd.Env, "LC_ALL=C") {
				s.t.Errorf("command %q ran without LC_ALL=C in its environment", got)
			}
			if st.stdin != nil {
				var in []byte
				if cmd.Stdin != nil {
					in, _ = io.ReadAll(cmd.Stdin)
				}
				if string(in) != *st.stdin {
					s.t.Errorf("command %q read stdin %q, want %q", got, in, *st.stdin)
				}
			}
			if st.err != nil {
				return nil, nil, st.err
			}
			if st.effect != nil {
				st.effect()
			}
			var err error
			if st.exitCode != 0 {
				err = testingexec.FakeExitError{Status: st.exitCode}
			}
			return []byte(st.stdout), []byte(st.stderr), err
		}}
		return testingexec.InitFakeCmd(cmd, name, args...)
	}
}

func (s *Script) failing(name string, args []string, err error) utilexec.Cmd {
	cmd := &testingexec.FakeCmd{RunScript: []testingexec.FakeAction{func() ([]byte, []byte, error) { return nil, nil, err }}}
	return testingexec.InitFakeCmd(cmd, name, args...)
}

// Command implements utilexec.Interface. Spindle never runs a command
// without a context, so this fails the test.
func (s *Script) Command(cmd string, args ...string) utilexec.Cmd {
	s.t.Errorf("command %s %v run without a context (no deadline)", cmd, args)
	return s.CommandContext(context.Background(), cmd, args...)
}

// CommandContext implements utilexec.Interface.
func (s *Script) CommandContext(ctx context.Context, cmd string, args ...string) utilexec.Cmd {
	line := strings.Join(append([]string{cmd}, args...), " ")
	if _, ok := ctx.Deadline(); !ok {
		s.t.Errorf("command %q run without a deadline", line)
	}
	s.mu.Lock()
	n := len(s.ran)
	s.ran = append(s.ran, line)
	s.mu.Unlock()
	if n >= len(s.steps) {
		s.t.Errorf("unexpected command #%d (script has %d): %s", n+1, len(s.steps), line)
		return s.failing(cmd, args, fmt.Errorf("commandtest: unexpected command %q", line))
	}
	return s.fake.CommandContext(ctx, cmd, args...)
}

// LookPath implements utilexec.Interface; every program is "found".
func (s *Script) LookPath(file string) (string, error) { return "/usr/bin/" + file, nil }
