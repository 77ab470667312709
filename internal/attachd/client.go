package attachd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"time"

	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/command"
)

// Client runs commands in the attach daemon: a k8s.io/utils/exec
// Interface, so that internal/command's Runner runs them as it runs any
// other. Only Run (and Output, CombinedOutput) are supported: the daemon
// answers when the command has ended.
type Client struct {
	socket string
	http   *http.Client
}

var _ utilexec.Interface = (*Client)(nil)

// NewClient returns a client of the daemon listening on socket.
func NewClient(socket string) *Client {
	return &Client{socket: socket, http: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}}
}

var _ command.DaemonHost = (*Client)(nil)

// Healthy reports whether the daemon answers.
func (c *Client) Healthy(ctx context.Context) error { return c.Check(ctx) }

// healthTimeout bounds a health check that has no deadline of its own: a
// daemon that does not answer in it is reported, not waited for.
const healthTimeout = 5 * time.Second

// Check reports whether the daemon answers, has programs, and runs in
// this process's PID namespace.
func (c *Client) Check(ctx context.Context, programs ...string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, healthTimeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://attachd/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("the attach daemon at %s does not answer: %w", c.socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the attach daemon at %s answers %s", c.socket, resp.Status)
	}
	var h Health
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxRequest)).Decode(&h); err != nil {
		return fmt.Errorf("the attach daemon at %s answers its health check with something else than its JSON: %w", c.socket, err)
	}
	if own := pidNamespace(); h.PIDNamespace != "" && own != "" && h.PIDNamespace != own {
		return fmt.Errorf("the attach daemon at %s runs in another PID namespace (%s) than this node plugin (%s): both need the host's (hostPID), for the node plugin finds, signals and waits for the volumes' daemons in /proc", c.socket, h.PIDNamespace, own)
	}
	var missing []string
	for _, p := range programs {
		if slices.Contains(h.Missing, p) || !slices.Contains(Programs, p) {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the attach daemon at %s cannot run %s: not in its image", c.socket, strings.Join(missing, ", "))
	}
	return nil
}

// Dir is the socket's directory: the daemon sees it at the same path, so
// files its programs read (rbd-fuse's key file) are written there.
func (c *Client) Dir() string { return filepath.Dir(c.socket) }

func (c *Client) Command(name string, args ...string) utilexec.Cmd {
	return c.CommandContext(context.Background(), name, args...)
}

func (c *Client) CommandContext(ctx context.Context, name string, args ...string) utilexec.Cmd {
	return &remoteCmd{c: c, ctx: ctx, req: ExecRequest{Name: name, Args: args}}
}

// LookPath finds nothing locally: the daemon has its own programs, and
// says when one is missing.
func (c *Client) LookPath(file string) (string, error) { return file, nil }

type remoteCmd struct {
	c              *Client
	ctx            context.Context
	req            ExecRequest
	stdin          io.Reader
	stdout, stderr io.Writer
}

func (r *remoteCmd) SetDir(string)                      {}
func (r *remoteCmd) SetStdin(in io.Reader)              { r.stdin = in }
func (r *remoteCmd) SetStdout(out io.Writer)            { r.stdout = out }
func (r *remoteCmd) SetStderr(out io.Writer)            { r.stderr = out }
func (r *remoteCmd) SetEnv(env []string)                { r.req.Env = env }
func (r *remoteCmd) Stop()                              {}
func (r *remoteCmd) Start() error                       { return errUnsupported("Start") }
func (r *remoteCmd) Wait() error                        { return errUnsupported("Wait") }
func (r *remoteCmd) StdoutPipe() (io.ReadCloser, error) { return nil, errUnsupported("StdoutPipe") }
func (r *remoteCmd) StderrPipe() (io.ReadCloser, error) { return nil, errUnsupported("StderrPipe") }

func errUnsupported(what string) error {
	return fmt.Errorf("%s is not supported for a command run by the attach daemon", what)
}

func (r *remoteCmd) Output() ([]byte, error) {
	var out bytes.Buffer
	r.stdout = &out
	err := r.Run()
	return out.Bytes(), err
}

func (r *remoteCmd) CombinedOutput() ([]byte, error) {
	var out bytes.Buffer
	r.stdout, r.stderr = &out, &out
	err := r.Run()
	return out.Bytes(), err
}

// Run sends the command and waits for its end. A non-zero exit is a
// utilexec.ExitError, as for a local command; a program the daemon does
// not have is utilexec.ErrExecutableNotFound.
func (r *remoteCmd) Run() error {
	if r.stdin != nil {
		data, err := io.ReadAll(r.stdin)
		if err != nil {
			return err
		}
		r.req.Stdin = data
	}
	if deadline, ok := r.ctx.Deadline(); ok {
		r.req.TimeoutMillis = time.Until(deadline).Milliseconds()
	}
	body, err := json.Marshal(r.req)
	if err != nil {
		return err
	}
	hreq, err := http.NewRequestWithContext(r.ctx, http.MethodPost, "http://attachd"+pathExec, bytes.NewReader(body))
	if err != nil {
		return err
	}
	hresp, err := r.c.http.Do(hreq)
	if err != nil {
		return fmt.Errorf("the attach daemon at %s: %w", r.c.socket, err)
	}
	defer hresp.Body.Close()
	if hresp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(hresp.Body, 4096))
		return fmt.Errorf("the attach daemon at %s refused %s: %s", r.c.socket, r.req.Name, strings.TrimSpace(string(msg)))
	}
	var resp ExecResponse
	if err := json.NewDecoder(hresp.Body).Decode(&resp); err != nil {
		return fmt.Errorf("the attach daemon's answer: %w", err)
	}
	if r.stdout != nil {
		_, _ = r.stdout.Write(resp.Stdout)
	}
	if r.stderr != nil {
		_, _ = r.stderr.Write(resp.Stderr)
	}
	switch {
	case resp.NotFound:
		return utilexec.ErrExecutableNotFound
	case resp.Error != "":
		return fmt.Errorf("in the attach daemon: %s", resp.Error)
	case resp.ExitCode != 0:
		return exitError(resp.ExitCode)
	}
	return nil
}

// exitError is a remote command's non-zero exit status.
type exitError int

var _ utilexec.ExitError = exitError(0)

func (e exitError) Error() string   { return fmt.Sprintf("exit status %d", int(e)) }
func (e exitError) String() string  { return e.Error() }
func (e exitError) Exited() bool    { return true }
func (e exitError) ExitStatus() int { return int(e) }
