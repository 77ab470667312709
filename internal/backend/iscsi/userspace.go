package iscsi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/qsd"
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

// Bounds of waiting for the loop driver.
const (
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
	if err := u.run.CheckDaemons(ctx, qsd.Program); err != nil {
		return errdefs.Wrap(errdefs.ErrUnavailable, err, "the userspace iSCSI attacher cannot start %s", qsd.Program)
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
	pid, args := qsd.Running(filepath.Join(u.dir(iqn), "qsd.pid"), func(args []string) bool {
		return strings.Contains(strings.Join(args, " "), ",target="+iqn+",")
	})
	return pid, pid != 0 && strings.Contains(strings.Join(args, " "), "writable=off")
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
		_, err := u.run.Daemons().Run(ctx, qsd.Program, args...)
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
	if err := qsd.Unmount(filepath.Join(dir, "lun")); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// stop ends the target's daemon (QMP quit, then signals) and cleans up.
func (u *userspace) stop(ctx context.Context, iqn string) error {
	pid, _ := u.daemon(iqn)
	if err := qsd.Stop(ctx, pid, filepath.Join(u.dir(iqn), "qmp.sock")); err != nil {
		return fmt.Errorf("target %s: %w", iqn, err)
	}
	return u.clean(u.dir(iqn))
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
	had, err := qsd.NodeSize(ctx, sock, qsdNode)
	if err != nil {
		return 0, err
	}
	if err := qsd.Resize(ctx, sock, qsdNode, had); err != nil {
		return 0, fmt.Errorf("have the iSCSI export of %s re-read its capacity: %w", s.IQN, err)
	}
	size, err := qsd.NodeSize(ctx, sock, qsdNode)
	if err != nil {
		return 0, err
	}
	// The loop driver takes the size the kernel has cached for the FUSE
	// file.
	if err := qsd.AwaitFileSize(u.lunFile(s.IQN), size); err != nil {
		return 0, fmt.Errorf("target %s: %w", s.IQN, err)
	}
	if err := u.loops.SetCapacity(ctx, dev); err != nil {
		return 0, err
	}
	return u.loops.Size(dev)
}
