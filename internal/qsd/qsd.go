// Package qsd controls qemu-storage-daemon processes that serve one
// block node each as a file through a FUSE export: the userspace attach
// paths (the iSCSI LUN through libiscsi, the RBD image through librbd)
// put a loop device on that file, on nodes whose kernel has neither
// initiator. A daemon is found by its pid file and command line, spoken to
// over its QMP socket, and stopped with QMP's quit, then signals.
package qsd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Program is the daemon's name.
const Program = "qemu-storage-daemon"

// Bounds of waiting for a daemon.
const (
	stopWait  = 5 * time.Second
	pollEvery = 20 * time.Millisecond
)

// Running returns the pid in pidFile if that process is a
// qemu-storage-daemon whose arguments match (0 when none: the file is
// missing or stale), and its arguments.
func Running(pidFile string, match func(args []string) bool) (int, []string) {
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, nil
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0, nil
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if len(args) == 0 || filepath.Base(args[0]) != Program || !match(args) {
		return 0, nil
	}
	return pid, args
}

// Stop ends the daemon pid: QMP quit on socket, then SIGTERM, then
// SIGKILL, each given a few seconds.
func Stop(ctx context.Context, pid int, socket string) error {
	if pid == 0 {
		return nil
	}
	_, qerr := QMP(ctx, socket, "quit", nil)
	if WaitGone(pid, stopWait) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	if WaitGone(pid, stopWait) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	if WaitGone(pid, stopWait) {
		return nil
	}
	return fmt.Errorf("%s %d does not stop (quit: %v)", Program, pid, qerr)
}

// WaitGone waits for pid to exit (a zombie counts as gone).
func WaitGone(pid int, wait time.Duration) bool {
	deadline := time.Now().Add(wait)
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		if _, rest, ok := strings.Cut(string(stat), ") "); ok && strings.HasPrefix(rest, "Z") {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollEvery)
	}
}

// Unmount removes a FUSE export whose daemon is gone (lazily: nothing is
// asked of the dead server).
func Unmount(path string) error {
	if !Mounted(path) {
		return nil
	}
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount the stale FUSE export %s: %w", path, err)
	}
	return nil
}

// Mounted reports whether path is a mount point in this mount namespace.
func Mounted(path string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && unescape(f[4]) == path {
			return true
		}
	}
	return false
}

// unescape undoes mountinfo's octal escapes of space, tab, newline and
// backslash.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// NodeSize is the size of a block node as qemu has it
// (query-named-block-nodes: the node's virtual-size).
func NodeSize(ctx context.Context, socket, node string) (int64, error) {
	out, err := QMP(ctx, socket, "query-named-block-nodes", map[string]any{"flat": true})
	if err != nil {
		return 0, fmt.Errorf("query the export's size: %w", err)
	}
	var nodes []struct {
		NodeName string `json:"node-name"`
		Image    struct {
			VirtualSize int64 `json:"virtual-size"`
		} `json:"image"`
	}
	if err := json.Unmarshal(out, &nodes); err != nil {
		return 0, fmt.Errorf("query-named-block-nodes answered %s: %w", out, err)
	}
	for _, n := range nodes {
		if n.NodeName == node {
			return n.Image.VirtualSize, nil
		}
	}
	return 0, fmt.Errorf("%s has no block node %q (query-named-block-nodes: %s)", Program, node, out)
}

// Resize has the daemon take a block node's new size (block_resize).
func Resize(ctx context.Context, socket, node string, size int64) error {
	_, err := QMP(ctx, socket, "block_resize", map[string]any{"node-name": node, "size": size})
	return err
}

// AwaitFileSize waits until the FUSE export at file reports at least size
// bytes: the kernel caches a FUSE file's attributes, and asks the daemon
// again once their timeout has passed.
func AwaitFileSize(file string, size int64) error {
	deadline := time.Now().Add(stopWait)
	for {
		st, err := os.Stat(file)
		if err != nil {
			return err
		}
		if st.Size() >= size {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the FUSE export %s still reports %d bytes, not %d", file, st.Size(), size)
		}
		time.Sleep(pollEvery)
	}
}

// QMP runs one QMP command on a daemon's control socket.
func QMP(ctx context.Context, socket, cmd string, args map[string]any) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	r := bufio.NewReader(conn)
	if _, err := r.ReadBytes('\n'); err != nil { // the greeting
		return nil, fmt.Errorf("QMP greeting: %w", err)
	}
	call := func(cmd string, args map[string]any) (json.RawMessage, error) {
		req := map[string]any{"execute": cmd}
		if args != nil {
			req["arguments"] = args
		}
		data, _ := json.Marshal(req)
		if _, err := conn.Write(append(data, '\n')); err != nil {
			return nil, err
		}
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				if cmd == "quit" {
					return nil, nil // the daemon closed the socket as it quit
				}
				return nil, err
			}
			var resp struct {
				Return json.RawMessage `json:"return"`
				Error  *struct {
					Desc string `json:"desc"`
				} `json:"error"`
			}
			if err := json.Unmarshal(line, &resp); err != nil {
				return nil, fmt.Errorf("QMP answered %q: %w", line, err)
			}
			if resp.Error != nil {
				return nil, fmt.Errorf("QMP %s: %s", cmd, resp.Error.Desc)
			}
			if resp.Return != nil {
				return resp.Return, nil
			}
			// An event: read on.
		}
	}
	if _, err := call("qmp_capabilities", nil); err != nil {
		return nil, err
	}
	return call(cmd, args)
}
