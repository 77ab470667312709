// Package command runs the external programs Spindle depends on (blkid,
// mkfs, mount, losetup, ...) the one way the project allows: through
// k8s.io/utils/exec so tests can script them, always with a deadline, always
// with LC_ALL=C so the output we parse and the errors we show are stable, and
// with stderr carried into the error so a failure explains itself.
package command

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	utilexec "k8s.io/utils/exec"
)

// DefaultTimeout bounds a command whose context has no deadline of its own.
const DefaultTimeout = 2 * time.Minute

// maxStderr is how much of a command's stderr goes into an error message.
const maxStderr = 4096

// Cmd describes one invocation.
type Cmd struct {
	Name string
	Args []string
	// Stdin is fed to the program; nil means an empty stdin, so a program
	// that would prompt (mke2fs "Proceed anyway?") fails instead of hanging.
	Stdin []byte
	// SecretArgs hides the arguments in errors and observations, for the
	// rare tool that only takes a credential on its command line.
	SecretArgs bool
	// Timeout overrides DefaultTimeout when the context has no deadline.
	Timeout time.Duration
	// Env adds "NAME=value" variables for this command only (tgtadm's
	// TGT_IPC_SOCKET, rbd-fuse's CEPH_ARGS); they cannot override LC_ALL.
	// Never a secret: /proc/PID/environ is readable by the process's owner.
	Env []string
}

// Observation is reported after every command, for metrics and debug logs.
type Observation struct {
	Name     string
	Args     []string // nil when the arguments are secret
	Duration time.Duration
	ExitCode int // 0 on success, -1 when the program did not exit normally
	Err      error
}

// Runner runs commands. The zero value is not usable; call New.
type Runner struct {
	exec    utilexec.Interface
	env     []string
	observe func(Observation)
	// daemons runs the commands that leave a daemon behind, on host;
	// nil: this runner.
	daemons *Runner
	host    DaemonHost
}

// DaemonHost is where the daemons serving attached volumes run when that
// is not this process: the attach daemon (internal/attachd), in a pod of
// its own that outlives the node plugin's restarts.
type DaemonHost interface {
	// Check reports whether the host answers, can run every one of
	// programs, and sees this process's PID namespace (the node plugin
	// finds, signals and waits for the daemons' processes in /proc).
	Check(ctx context.Context, programs ...string) error
	// Dir is a directory the host's programs see at the same path as
	// this process: what a daemon reads after it starts (a key file) is
	// written there.
	Dir() string
}

// WithDaemons returns a runner like r whose Daemons is d, running on host:
// the commands that start a process serving an attached volume (rbd-fuse,
// rbd-nbd map, qemu-storage-daemon) run there, in the attach daemon, so
// that they outlive the node plugin.
func (r *Runner) WithDaemons(d *Runner, host DaemonHost) *Runner {
	c := *r
	c.daemons, c.host = d, host
	return &c
}

// Daemons is the runner for the commands that leave a daemon serving an
// attached volume behind: r itself, unless WithDaemons said otherwise.
func (r *Runner) Daemons() *Runner {
	if r.daemons != nil {
		return r.daemons
	}
	return r
}

// CheckDaemons reports whether Daemons can run programs now: the attach
// daemon answers and has them or, without one, they are on this process's
// PATH. A missing program is an error naming it.
func (r *Runner) CheckDaemons(ctx context.Context, programs ...string) error {
	if r.host != nil {
		return r.host.Check(ctx, programs...)
	}
	var missing []string
	for _, p := range programs {
		if _, err := r.exec.LookPath(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s not found in PATH", strings.Join(missing, ", "))
	}
	return nil
}

// DaemonsDir is a directory that the programs Daemons runs see at the same
// path as this process ("" when they run here: any directory will do).
func (r *Runner) DaemonsDir() string {
	if r.host != nil {
		return r.host.Dir()
	}
	return ""
}

// New returns a Runner on top of e (utilexec.New() in production, a
// testingexec.FakeExec in tests). observe may be nil.
func New(e utilexec.Interface, observe func(Observation)) *Runner {
	return &Runner{exec: e, env: cEnvironment(os.Environ()), observe: observe}
}

// cEnvironment is the process environment with every locale variable
// replaced by LC_ALL=C.
func cEnvironment(environ []string) []string {
	env := make([]string, 0, len(environ)+1)
	for _, kv := range environ {
		if strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") || strings.HasPrefix(kv, "LANGUAGE=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

// Run runs name with args and returns its stdout.
func (r *Runner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return r.Exec(ctx, Cmd{Name: name, Args: args})
}

// Exec runs c and returns its stdout. A failure is an *Error.
func (r *Runner) Exec(ctx context.Context, c Cmd) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		timeout := c.Timeout
		if timeout <= 0 {
			timeout = DefaultTimeout
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}

	if err := checkArgSize(c.Args, r.env, c.Env); err != nil {
		e := &Error{Name: c.Name, ExitCode: -1, Err: err}
		if r.observe != nil {
			r.observe(Observation{Name: c.Name, ExitCode: -1, Err: e})
		}
		return nil, e
	}
	var stdout, stderr bytes.Buffer
	cmd := r.exec.CommandContext(ctx, c.Name, c.Args...)
	env := r.env
	if len(c.Env) > 0 {
		// LC_ALL=C stays last, so it wins over anything in c.Env.
		env = append(append(append([]string{}, r.env[:len(r.env)-1]...), c.Env...), r.env[len(r.env)-1])
	}
	cmd.SetEnv(env)
	cmd.SetStdin(bytes.NewReader(c.Stdin))
	cmd.SetStdout(&stdout)
	cmd.SetStderr(&stderr)

	start := time.Now()
	runErr := cmd.Run()
	elapsed := time.Since(start)

	var err error
	exitCode := 0
	if runErr != nil {
		e := &Error{Name: c.Name, ExitCode: -1, Stderr: trimStderr(stderr.String()), Err: runErr}
		if !c.SecretArgs {
			e.Args = c.Args
		}
		var exitErr utilexec.ExitError
		if errors.As(runErr, &exitErr) && exitErr.Exited() {
			e.ExitCode = exitErr.ExitStatus()
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			// The program was killed because we gave up on it; say so
			// rather than "signal: killed".
			e.Err = fmt.Errorf("%w after %s", ctxErr, elapsed.Round(time.Millisecond))
			e.ExitCode = -1
		}
		exitCode = e.ExitCode
		err = e
	}
	if r.observe != nil {
		o := Observation{Name: c.Name, Duration: elapsed, ExitCode: exitCode, Err: err}
		if !c.SecretArgs {
			o.Args = c.Args
		}
		r.observe(o)
	}
	return stdout.Bytes(), err
}

// The kernel's limits on what execve takes: one argument or variable of
// at most MAX_ARG_STRLEN (32 pages), and all of them with their pointers
// within a quarter of the stack limit (ARG_MAX; 2 MiB with the usual
// 8 MiB stack). Beyond them execve fails with E2BIG, which k8s.io/utils/exec
// reports as "executable file not found": checked here, it says so.
const maxArgLength = 32 * 4096

func checkArgSize(args, env, extraEnv []string) error {
	total := 0
	for i, a := range args {
		if len(a) >= maxArgLength {
			return fmt.Errorf("argument list too long (E2BIG): argument %d is %d bytes; the kernel takes at most %d in one argument", i+1, len(a), maxArgLength-1)
		}
		total += len(a) + 1 + 8
	}
	for _, e := range append(append([]string{}, env...), extraEnv...) {
		total += len(e) + 1 + 8
	}
	if limit := argMax(); total > limit {
		return fmt.Errorf("argument list too long (E2BIG): %d arguments and the environment take %d bytes; the kernel takes at most %d", len(args), total, limit)
	}
	return nil
}

// argMax is ARG_MAX as execve computes it: a quarter of the stack limit,
// at least 128 KiB.
func argMax() int {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_STACK, &lim); err != nil || lim.Cur == unix.RLIM_INFINITY || lim.Cur/4 > 1<<30 {
		return 1 << 30
	}
	return max(int(lim.Cur/4), 128<<10)
}

func trimStderr(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > maxStderr {
		s = s[:maxStderr] + "...(truncated)"
	}
	return s
}

// Error is a command that failed to run or exited non-zero.
type Error struct {
	Name     string
	Args     []string // nil when secret
	ExitCode int      // -1 when the program did not exit normally
	Stderr   string
	Err      error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Name)
	if e.Args != nil {
		for _, a := range e.Args {
			b.WriteByte(' ')
			b.WriteString(a)
		}
	} else {
		b.WriteString(" (arguments hidden)")
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	if e.Stderr != "" {
		b.WriteString(": ")
		b.WriteString(e.Stderr)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// ExitCode returns the exit status of a command error, or -1 when err is not
// a command that exited (nil, not found, killed, timed out).
func ExitCode(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.ExitCode
	}
	return -1
}

// Stderr returns the captured stderr of a command error, or "".
func Stderr(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Stderr
	}
	return ""
}
