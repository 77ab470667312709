package iscsi

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// userspace logs in with qemu-storage-daemon's iSCSI client (libiscsi),
// exports the LUN as a file through FUSE and binds a loop device to that
// file: a real block device on a node whose kernel has no iSCSI initiator.
//
// One daemon per target, in <stateDir>/<target IQN>/: "lun" (the FUSE
// mount point), "qmp.sock" (its control socket, for resizing and stopping)
// and "qsd.pid". The daemon's export is read-only when the first attach is;
// read-only loop devices can sit beside a read-write one on a writable
// export. The last detach stops the daemon, which removes the FUSE mount.
type userspace struct {
	run      *command.Runner
	loops    blockdev.LoopDevices
	stateDir string
	devRoot  string // "/dev"
}

func newUserspace(run *command.Runner, stateDir string) *userspace {
	return &userspace{run: run, loops: blockdev.NewLosetup(run), stateDir: stateDir, devRoot: "/dev"}
}

// qsdNode is the block node and export name inside each daemon.
const qsdNode = "lun"

// Bounds of waiting for the daemon and the loop driver.
const (
	stopWait    = 5 * time.Second
	releaseWait = time.Second
	pollEvery   = 20 * time.Millisecond
)

// dir is the target's state directory, named by a hash of the IQN: an
// IQN is up to 223 bytes and the QMP socket's path must fit in 108.
func (u *userspace) dir(iqn string) string {
	sum := sha256.Sum256([]byte(iqn))
	return filepath.Join(u.stateDir, "qsd-"+hex.EncodeToString(sum[:8]))
}

func (u *userspace) lunFile(iqn string) string { return filepath.Join(u.dir(iqn), "lun") }

// Probe: FUSE, loop devices, losetup here and qemu-storage-daemon where
// it runs (in the attach daemon, when the node plugin has one).
func (u *userspace) Probe(ctx context.Context) error {
	if err := u.run.CheckDaemons(ctx, "qemu-storage-daemon"); err != nil {
		return errdefs.Wrap(errdefs.ErrUnavailable, err, "the userspace iSCSI attacher cannot start qemu-storage-daemon")
	}
	var missing []string
	if _, err := exec.LookPath("losetup"); err != nil {
		missing = append(missing, "losetup")
	}
	for _, f := range []string{filepath.Join(u.devRoot, "fuse"), filepath.Join(u.devRoot, "loop-control")} {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return errdefs.Unavailable("the userspace iSCSI attacher needs %s, missing on this node", strings.Join(missing, ", "))
	}
	return nil
}

// daemon returns the pid of the target's running daemon (0 when none) and
// whether its export is read-only. A pid file whose process is not a
// qemu-storage-daemon for this target is stale.
func (u *userspace) daemon(iqn string) (pid int, readOnly bool) {
	data, err := os.ReadFile(filepath.Join(u.dir(iqn), "qsd.pid"))
	if err != nil {
		return 0, false
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0, false
	}
	args := strings.Split(string(cmdline), "\x00")
	if len(args) == 0 || filepath.Base(args[0]) != "qemu-storage-daemon" {
		return 0, false
	}
	joined := strings.Join(args, " ")
	if !strings.Contains(joined, ",target="+iqn+",") {
		return 0, false
	}
	return pid, strings.Contains(joined, "writable=off")
}

func (u *userspace) Connect(ctx context.Context, s session) (*connDevice, error) {
	if s.CHAP.Mutual() {
		return nil, errdefs.Precondition("the userspace iSCSI attacher cannot do mutual CHAP (qemu's iSCSI client has no target credentials): drop %s/%s or use attachMode kernel", SecretMutualUser, SecretMutualPassword)
	}
	pid, daemonRO := u.daemon(s.IQN)
	if pid != 0 && daemonRO && !s.ReadOnly {
		return nil, errdefs.Precondition("target %s is attached read-only on this node; detach it before attaching it read-write", s.IQN)
	}
	started := false
	if pid == 0 {
		if err := u.start(ctx, s); err != nil {
			return nil, err
		}
		started = true
	}
	// The loop device has Spindle's one geometry (4 KiB sectors), but goes
	// through the page cache: with direct I/O on qemu-storage-daemon's
	// FUSE export, an ext4 made through the device did not mount again
	// ("probably corrupted filesystem"; csi-sanity failed 6 specs here).
	dev, err := u.loops.Attach(ctx, u.lunFile(s.IQN), s.ReadOnly, false)
	if err == nil {
		var d *connDevice
		if d, err = u.Identify(ctx, s.IQN, s.Serial, dev); err == nil && d.ReadOnly == s.ReadOnly {
			return d, nil
		}
		if err == nil {
			err = errdefs.Precondition("loop device %s came up with read-only=%t, asked for %t", dev, d.ReadOnly, s.ReadOnly)
		}
		_ = u.loops.Detach(ctx, dev)
	}
	if started {
		// Leave no daemon without a device behind.
		if serr := u.stop(ctx, s.IQN); serr != nil {
			err = errors.Join(err, serr)
		}
	}
	return nil, err
}

// start runs the daemon for s, logged in as s.Initiator. The CHAP password
// reaches it in a 0600 file that is removed once the daemon has logged in.
func (u *userspace) start(ctx context.Context, s session) error {
	dir := u.dir(s.IQN)
	if err := u.clean(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	lun := filepath.Join(dir, "lun")
	if err := os.WriteFile(lun, nil, 0o600); err != nil {
		return err
	}
	blockdev := fmt.Sprintf("driver=iscsi,node-name=%s,transport=tcp,portal=%%s,target=%s,lun=%d,initiator-name=%s",
		qsdNode, s.IQN, s.LUN, s.Initiator)
	var pre []string
	if s.CHAP != nil {
		secret := filepath.Join(dir, "chap")
		if err := os.WriteFile(secret, []byte(s.CHAP.Password), 0o600); err != nil {
			return err
		}
		defer os.Remove(secret)
		pre = []string{"--object", "secret,id=chap,format=raw,file=" + secret}
		blockdev += ",user=" + s.CHAP.User + ",password-secret=chap"
	}
	writable := "on"
	if s.ReadOnly {
		blockdev += ",read-only=on"
		writable = "off"
	}
	var errs []error
	for _, portal := range s.Portals {
		args := append(append([]string{}, pre...),
			"--blockdev", fmt.Sprintf(blockdev, portal),
			"--export", fmt.Sprintf("type=fuse,id=%s,node-name=%s,mountpoint=%s,writable=%s", qsdNode, qsdNode, lun, writable),
			"--chardev", "socket,id=qmp,server=on,wait=off,path="+filepath.Join(dir, "qmp.sock"),
			"--monitor", "chardev=qmp",
			"--pidfile", filepath.Join(dir, "qsd.pid"),
			"--daemonize",
		)
		// In the attach daemon when the node plugin has one: the daemon
		// serves the LUN for as long as it is attached and must outlive
		// the node plugin. Its directory is on a host path both see, so
		// its FUSE export reaches this process's mount table.
		_, err := u.run.Daemons().Run(ctx, "qemu-storage-daemon", args...)
		if err == nil {
			return nil
		}
		err = loginError(err, s, portal)
		if errdefs.KindOf(err) != errdefs.ErrUnavailable {
			_ = u.clean(dir)
			return err // the target answered: another portal answers the same
		}
		errs = append(errs, err)
	}
	_ = u.clean(dir)
	return errors.Join(errs...)
}

// loginError turns libiscsi's login failures into errors of a kind.
func loginError(err error, s session, portal string) error {
	stderr := command.Stderr(err)
	switch {
	case strings.Contains(stderr, "Authentication failure"):
		return errdefs.Wrap(errdefs.ErrPrecondition, err, "CHAP authentication of initiator %s to target %s failed: the NodeStageVolume secrets do not match the target's account", s.Initiator, s.IQN)
	case strings.Contains(stderr, "Target not found"):
		return errdefs.Wrap(errdefs.ErrPrecondition, err, "target %s at %s does not let initiator %s log in (not in its ACL: is the volume published to this node?)", s.IQN, portal, s.Initiator)
	default:
		return errdefs.Wrap(errdefs.ErrUnavailable, err, "cannot log in to target %s at %s", s.IQN, portal)
	}
}

// clean removes what a dead daemon left in dir: a FUSE mount that lost
// its server, the files.
func (u *userspace) clean(dir string) error {
	lun := filepath.Join(dir, "lun")
	if mounted(lun) {
		if err := unix.Unmount(lun, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount the stale FUSE export %s: %w", lun, err)
		}
	}
	return os.RemoveAll(dir)
}

// mounted reports whether path is a mount point.
func mounted(path string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

// stop ends the target's daemon (QMP quit, then signals) and cleans up.
func (u *userspace) stop(ctx context.Context, iqn string) error {
	dir := u.dir(iqn)
	pid, _ := u.daemon(iqn)
	if pid != 0 {
		_, qerr := qmp(ctx, filepath.Join(dir, "qmp.sock"), "quit", nil)
		if !waitGone(pid, stopWait) {
			_ = syscall.Kill(pid, syscall.SIGTERM)
			if !waitGone(pid, stopWait) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				if !waitGone(pid, stopWait) {
					return fmt.Errorf("qemu-storage-daemon %d of target %s does not stop (quit: %v)", pid, iqn, qerr)
				}
			}
		}
	}
	return u.clean(dir)
}

// waitGone waits for pid to exit (a zombie counts as gone).
func waitGone(pid int, wait time.Duration) bool {
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

// loopDevices lists the loop devices bound to file.
func (u *userspace) loopDevices(ctx context.Context, file string) ([]connDevice, error) {
	devs, err := u.loops.BoundTo(ctx, file)
	if err != nil {
		return nil, err
	}
	var out []connDevice
	for _, d := range devs {
		if !d.Deleted {
			out = append(out, connDevice{Path: d.Path, ReadOnly: d.ReadOnly})
		}
	}
	return out, nil
}

func (u *userspace) Devices(ctx context.Context, iqn, _ string) ([]connDevice, error) {
	if pid, _ := u.daemon(iqn); pid == 0 {
		return nil, nil // a loop device on a dead export is no device of the LUN
	}
	return u.loopDevices(ctx, u.lunFile(iqn))
}

// Identify: dev is a loop device bound to the target's FUSE export, and
// that export's daemon is logged in to the target. (The serial is the
// kernel mode's check; here the daemon was started for exactly this IQN,
// whose target carries exactly this image.)
func (u *userspace) Identify(ctx context.Context, iqn, _, dev string) (*connDevice, error) {
	d, err := u.loops.Get(ctx, dev)
	// An error of no kind (losetup timed out) is that error, not a device.
	if kind := errdefs.KindOf(err); kind == errdefs.ErrNotFound || kind == errdefs.ErrInvalidArgument {
		return nil, errdefs.NotFound("%s is not a loop device of target %s", dev, iqn)
	} else if err != nil {
		return nil, err
	}
	if pid, _ := u.daemon(iqn); pid == 0 {
		return nil, errdefs.NotFound("%s: no qemu-storage-daemon is logged in to target %s on this node", dev, iqn)
	}
	if ok, err := u.loops.Resolve(d, u.lunFile(iqn)); err != nil {
		return nil, err
	} else if !ok || d.Deleted {
		return nil, errdefs.NotFound("%s is not bound to the export of target %s", dev, iqn)
	}
	return &connDevice{Path: dev, ReadOnly: d.ReadOnly}, nil
}

// Disconnect unbinds the loop device dev of the target's export.
func (u *userspace) Disconnect(ctx context.Context, iqn, _, dev string) error {
	return u.detachLoop(ctx, iqn, u.lunFile(iqn), dev)
}

// Release stops the target's daemon, which removes its FUSE export, once
// no loop device uses the export.
func (u *userspace) Release(ctx context.Context, iqn string) error {
	return u.stop(ctx, iqn)
}

// detachLoop unbinds dev unless something holds it (a mount, an exclusive
// open); a device the kernel keeps bound because a process still has it
// open is reported, not assumed released.
func (u *userspace) detachLoop(ctx context.Context, iqn, lun, dev string) error {
	if busy, _ := blockdev.InUse(dev); busy {
		return errdefs.Precondition("loop device %s of target %s is still in use (mounted or held open exclusively)", dev, iqn)
	}
	if err := u.loops.Detach(ctx, dev); err != nil {
		return err
	}
	deadline := time.Now().Add(releaseWait)
	for {
		d, err := u.loops.Get(ctx, dev)
		if err != nil {
			return nil
		}
		if same, err := u.loops.Resolve(d, lun); err != nil || !same {
			return nil // released, and already bound again to something else
		}
		if time.Now().After(deadline) {
			return errdefs.Precondition("loop device %s of target %s is still held open by a process; it is released when that process closes it", dev, iqn)
		}
		time.Sleep(pollEvery)
	}
}

// Refresh has the daemon re-read the LUN's capacity, then the loop device
// take the export's new size. qemu's iSCSI driver issues a fresh READ
// CAPACITY on every block_resize and takes the size the target reports
// (a resize to any size up to it succeeds; a larger one is "Cannot grow
// iSCSI devices"): a resize to the size the daemon has now asks for nothing
// else, so the node needs no record of the image's size.
func (u *userspace) Refresh(ctx context.Context, s session, dev string) (int64, error) {
	sock := filepath.Join(u.dir(s.IQN), "qmp.sock")
	had, err := lunSize(ctx, sock)
	if err != nil {
		return 0, err
	}
	if _, err := qmp(ctx, sock, "block_resize", map[string]any{"node-name": qsdNode, "size": had}); err != nil {
		return 0, fmt.Errorf("have the iSCSI export of %s re-read its capacity: %w", s.IQN, err)
	}
	size, err := lunSize(ctx, sock)
	if err != nil {
		return 0, err
	}
	// The loop driver takes the size the kernel has cached for the FUSE
	// file; a stat makes FUSE ask the daemon again once its attribute
	// timeout has passed.
	lun := u.lunFile(s.IQN)
	deadline := time.Now().Add(stopWait)
	for {
		st, err := os.Stat(lun)
		if err != nil {
			return 0, err
		}
		if st.Size() >= size {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the FUSE export of %s still reports %d bytes, not %d", s.IQN, st.Size(), size)
		}
		time.Sleep(pollEvery)
	}
	if err := u.loops.SetCapacity(ctx, dev); err != nil {
		return 0, err
	}
	return u.loops.Size(dev)
}

// lunSize is the size of the daemon's LUN as qemu has it
// (query-named-block-nodes: the node's virtual-size).
func lunSize(ctx context.Context, sock string) (int64, error) {
	out, err := qmp(ctx, sock, "query-named-block-nodes", map[string]any{"flat": true})
	if err != nil {
		return 0, fmt.Errorf("query the iSCSI export's size: %w", err)
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
		if n.NodeName == qsdNode {
			return n.Image.VirtualSize, nil
		}
	}
	return 0, fmt.Errorf("qemu-storage-daemon has no block node %q (query-named-block-nodes: %s)", qsdNode, out)
}

// qmp runs one QMP command on a daemon's control socket.
func qmp(ctx context.Context, socket, cmd string, args map[string]any) (json.RawMessage, error) {
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
