// Package attachd keeps the userspace processes that serve attached
// volumes (rbd-fuse, rbd-nbd, qemu-storage-daemon) out of the node
// plugin's container, so that a node plugin restart or upgrade does not
// kill them and cut every pod on those volumes off its data.
//
// The attach daemon (spindle --mode=attach-daemon) is a small process that
// runs in a pod of its own, which the chart updates only when it is deleted
// (OnDelete): it starts the commands a node plugin asks it to over a unix
// socket, as its own children, so the daemons those commands leave behind
// live in its container. The node plugin runs them through Client, an
// implementation of k8s.io/utils/exec, so internal/command's rules (a
// deadline, LC_ALL=C, stderr in the error) hold for them unchanged.
package attachd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Programs are the only commands the daemon runs: those that start a
// process serving an attached volume, and their own control commands.
var Programs = []string{"rbd-fuse", "rbd-nbd", "qemu-storage-daemon"}

// pathExec is the one endpoint: run a command and answer how it ended.
const pathExec = "/v1/exec"

// maxRequest bounds what a request may carry (arguments, environment,
// stdin); the commands the node plugin sends are a few KiB.
const maxRequest = 1 << 20

// ExecRequest is one command to run.
type ExecRequest struct {
	Name string   `json:"name"`
	Args []string `json:"args"`
	// Env is the command's whole environment (the client's, with its
	// LC_ALL=C): the daemon's own does not leak in.
	Env   []string `json:"env"`
	Stdin []byte   `json:"stdin,omitempty"`
	// TimeoutMillis is the client's remaining deadline.
	TimeoutMillis int64 `json:"timeoutMillis"`
}

// Health is the daemon's answer to GET /healthz.
type Health struct {
	// PIDNamespace is the daemon's PID namespace ("pid:[4026531836]"): a
	// node plugin must share it to find the daemons' processes in /proc.
	PIDNamespace string `json:"pidNamespace"`
	// Missing lists the Programs the daemon cannot find in its PATH.
	Missing []string `json:"missing,omitempty"`
}

// pidNamespace names the PID namespace of this process.
func pidNamespace() string {
	ns, _ := os.Readlink("/proc/self/ns/pid")
	return ns
}

func (s *Server) serveHealth(w http.ResponseWriter, _ *http.Request) {
	h := Health{PIDNamespace: pidNamespace()}
	for _, p := range Programs {
		if _, err := exec.LookPath(p); err != nil {
			h.Missing = append(h.Missing, p)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(h)
}

// ExecResponse is how it ended.
type ExecResponse struct {
	Stdout   []byte `json:"stdout"`
	Stderr   []byte `json:"stderr"`
	ExitCode int    `json:"exitCode"` // -1: did not exit normally (Error says why)
	Error    string `json:"error,omitempty"`
	// NotFound: the program is not there.
	NotFound bool `json:"notFound,omitempty"`
}

// Server is the attach daemon.
type Server struct {
	Socket string
	Log    *zap.Logger
}

// Serve listens on the socket (made 0600; a stale socket is replaced) and
// serves until ctx ends. Children it started keep running after it stops
// serving: they are the volumes' daemons.
func (s *Server) Serve(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(s.Socket), 0o700); err != nil {
		return err
	}
	if err := os.Remove(s.Socket); err != nil && !os.IsNotExist(err) {
		return err
	}
	lis, err := net.Listen("unix", s.Socket)
	if err != nil {
		return err
	}
	if err := os.Chmod(s.Socket, 0o600); err != nil {
		lis.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+pathExec, s.serveExec)
	mux.HandleFunc("GET /healthz", s.serveHealth)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	s.Log.Info("attach daemon serving", zap.String("socket", s.Socket), zap.Strings("programs", Programs))
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	s.Log.Info("attach daemon stopped serving; the processes it started keep running")
	return nil
}

func (s *Server) serveExec(w http.ResponseWriter, r *http.Request) {
	var req ExecRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, maxRequest)).Decode(&req); err != nil {
		http.Error(w, "malformed request: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !slices.Contains(Programs, req.Name) {
		http.Error(w, fmt.Sprintf("the attach daemon runs only %s, not %q", strings.Join(Programs, ", "), req.Name), http.StatusForbidden)
		return
	}
	timeout := time.Duration(req.TimeoutMillis) * time.Millisecond
	if timeout <= 0 || timeout > 30*time.Minute {
		timeout = 2 * time.Minute
	}
	// The command runs to its end (or its deadline) even when the node
	// plugin that asked is gone, killed in the middle of a stage: a daemon
	// killed half-way through its start leaves kernel state behind (an nbd
	// device without its server, a FUSE mount without its daemon) that the
	// retried stage would trip over.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), timeout)
	defer cancel()
	resp := s.run(ctx, req)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// run runs the command. A program that daemonizes (rbd-fuse, rbd-nbd map,
// qemu-storage-daemon --daemonize) returns once its daemon serves; the
// daemon stays, a child of this process's container. Its own process
// group keeps a signal to the daemon's group from reaching it.
func (s *Server) run(ctx context.Context, req ExecRequest) ExecResponse {
	cmd := exec.CommandContext(ctx, req.Name, req.Args...)
	cmd.Env = req.Env
	cmd.Stdin = bytes.NewReader(req.Stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A daemon holds the pipes' write ends; stop waiting for them once the
	// command itself has exited.
	cmd.WaitDelay = time.Second
	start := time.Now()
	err := cmd.Run()
	resp := ExecResponse{Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr) && exitErr.Exited():
		resp.ExitCode = exitErr.ExitCode()
	case errors.Is(err, exec.ErrNotFound):
		resp.ExitCode, resp.NotFound, resp.Error = -1, true, err.Error()
	case errors.Is(err, exec.ErrWaitDelay):
		// Exited 0, but a daemon it left keeps stdout open: that is how a
		// daemonizing program that does not close its pipes looks.
	default:
		resp.ExitCode, resp.Error = -1, err.Error()
		if ctx.Err() != nil {
			resp.Error = fmt.Sprintf("%v after %s", ctx.Err(), time.Since(start).Round(time.Millisecond))
		}
	}
	s.Log.Info("ran", zap.String("name", req.Name), zap.Int("exitCode", resp.ExitCode), zap.Duration("duration", time.Since(start)))
	return resp
}
