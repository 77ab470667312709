// Command cephproxy runs a guest's cluster-side rbd and ceph commands on
// the host, for `make vmtest`.
//
// Under software emulation every rbd call costs seconds (the CLI and its
// libraries start in an emulated CPU), and the RBD backend's store makes
// dozens per test: the conformance suite took 40 minutes per mounter, most
// of it in "rbd create / info / image-meta / snap". Only the mapping needs
// the guest's kernel. So in the guest this binary stands in for rbd and
// ceph (the guest's PATH names its directory first): "rbd device ..." (map,
// unmap, list: the kernel's part) runs the guest's own rbd; everything else
// runs on the host, against the same Ceph, and prints and exits exactly as
// there. Files named by -c/--conf, -k/--keyring and --keyfile travel with
// the command (the host cannot read the guest's), as does CEPH_CONF's.
//
//	cephproxy serve ADDRESS            on the host, in the guests' netns
//	rbd ARGS... / ceph ARGS...         in the guest, with SPINDLE_CEPH_PROXY=ADDRESS
//
// Without SPINDLE_CEPH_PROXY the stand-in runs the guest's own command.
// The proxy serves only the guests' private network and runs nothing but
// rbd and ceph.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// EnvProxy names the host's proxy (host:port) in the guest.
const EnvProxy = "SPINDLE_CEPH_PROXY"

// fileFlags take a path whose content the host needs.
var fileFlags = []string{"-c", "--conf", "-k", "--keyring", "--keyfile"}

// request is one command: its tool, arguments, and the content of each
// file argument (by index into Args) and of CEPH_CONF.
type request struct {
	Tool     string         `json:"tool"`
	Args     []string       `json:"args"`
	Files    map[int][]byte `json:"files,omitempty"`
	CephConf []byte         `json:"cephConf,omitempty"`
}

// response is what the host's command did.
type response struct {
	Stdout []byte `json:"stdout"`
	Stderr []byte `json:"stderr"`
	Exit   int    `json:"exit"`
	Error  string `json:"error,omitempty"` // the command could not run at all
}

func main() {
	tool := filepath.Base(os.Args[0])
	if tool == "cephproxy" {
		if len(os.Args) != 3 || os.Args[1] != "serve" {
			fmt.Fprintln(os.Stderr, "usage: cephproxy serve HOST:PORT (or run as rbd or ceph)")
			os.Exit(2)
		}
		if err := serve(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "cephproxy:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(standIn(tool, os.Args[1:]))
}

// standIn runs tool args here or on the host, and returns the exit status.
func standIn(tool string, args []string) int {
	addr := os.Getenv(EnvProxy)
	if addr == "" || (tool == "rbd" && len(args) > 0 && args[0] == "device") {
		return execLocal(tool, args)
	}
	req := request{Tool: tool, Args: args, Files: map[int][]byte{}}
	for i := 0; i+1 < len(args); i++ {
		if slices.Contains(fileFlags, args[i]) {
			data, err := os.ReadFile(args[i+1])
			if err != nil {
				fmt.Fprintf(os.Stderr, "cephproxy: %s %s: %v\n", args[i], args[i+1], err)
				return 1
			}
			req.Files[i+1] = data
		}
	}
	if p := os.Getenv("CEPH_CONF"); p != "" {
		data, err := os.ReadFile(p)
		if err != nil {
			fmt.Fprintf(os.Stderr, "cephproxy: CEPH_CONF %s: %v\n", p, err)
			return 1
		}
		req.CephConf = data
	}
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cephproxy: %s=%s: %v\n", EnvProxy, addr, err)
		return 1
	}
	defer conn.Close()
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		fmt.Fprintf(os.Stderr, "cephproxy: send: %v\n", err)
		return 1
	}
	var resp response
	if err := json.NewDecoder(conn).Decode(&resp); err != nil {
		fmt.Fprintf(os.Stderr, "cephproxy: receive: %v\n", err)
		return 1
	}
	if resp.Error != "" {
		fmt.Fprintf(os.Stderr, "cephproxy: on the host: %s\n", resp.Error)
		return 1
	}
	_, _ = os.Stdout.Write(resp.Stdout)
	_, _ = os.Stderr.Write(resp.Stderr)
	return resp.Exit
}

// execLocal replaces this process with the guest's own tool: the first on
// PATH that is not this stand-in.
func execLocal(tool string, args []string) int {
	self, _ := os.Executable()
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		p := filepath.Join(dir, tool)
		if resolved, err := filepath.EvalSymlinks(p); err != nil || resolved == self || sameFile(p, self) {
			continue
		}
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			continue
		}
		err := syscall.Exec(p, append([]string{tool}, args...), os.Environ())
		fmt.Fprintf(os.Stderr, "cephproxy: exec %s: %v\n", p, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "cephproxy: no %s on PATH besides this stand-in\n", tool)
	return 127
}

func sameFile(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

func serve(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "cephproxy: serving %s\n", addr)
	return serveOn(l)
}

func serveOn(l net.Listener) error {
	for {
		conn, err := l.Accept()
		if err != nil {
			return err
		}
		go handle(conn)
	}
}

func handle(conn net.Conn) {
	defer conn.Close()
	var req request
	if err := json.NewDecoder(conn).Decode(&req); err != nil {
		return
	}
	resp := run(req)
	_ = json.NewEncoder(conn).Encode(resp)
}

// run runs the request's command with its files written to a temporary
// directory, and LC_ALL=C, within five minutes.
func run(req request) response {
	if req.Tool != "rbd" && req.Tool != "ceph" {
		return response{Error: fmt.Sprintf("%q is not rbd or ceph", req.Tool)}
	}
	dir, err := os.MkdirTemp("", "cephproxy-")
	if err != nil {
		return response{Error: err.Error()}
	}
	defer os.RemoveAll(dir)
	args := slices.Clone(req.Args)
	for i, data := range req.Files {
		if i < 0 || i >= len(args) {
			return response{Error: fmt.Sprintf("file argument %d out of range", i)}
		}
		p := filepath.Join(dir, fmt.Sprintf("arg%d", i))
		if err := os.WriteFile(p, data, 0o600); err != nil {
			return response{Error: err.Error()}
		}
		args[i] = p
	}
	env := append(os.Environ(), "LC_ALL=C")
	if req.CephConf != nil {
		p := filepath.Join(dir, "ceph.conf")
		if err := os.WriteFile(p, req.CephConf, 0o600); err != nil {
			return response{Error: err.Error()}
		}
		env = append(env, "CEPH_CONF="+p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, req.Tool, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	resp := response{Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		resp.Exit = exit.ExitCode()
	case err != nil:
		resp.Error = strings.TrimSpace(err.Error())
	}
	return resp
}
