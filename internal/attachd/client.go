package attachd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	utilexec "k8s.io/utils/exec"
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

// Healthy reports whether the daemon answers.
func (c *Client) Healthy(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://attachd/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("the attach daemon at %s does not answer: %w", c.socket, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the attach daemon at %s answers %s", c.socket, resp.Status)
	}
	return nil
}

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
