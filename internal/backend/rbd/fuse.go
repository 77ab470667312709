package rbd

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/qsd"
)

// fuseMapper is the rbd-fuse mounter: the image as a file through FUSE,
// served from userspace, with a loop device bound to it — a real block
// device on a node without the rbd or nbd kernel modules.
//
// The file is served by qemu-storage-daemon's rbd driver (librbd) through
// its FUSE export, one daemon per image, started in the attach daemon when
// the node plugin has one. (rbd-fuse itself served it before: Ceph 20.2.4's
// rbd-fuse crashes under libfuse 3.18 whenever it is given a pool, in
// fuse_opt_parse, so it serves nothing but a pool named "rbd". The mounter
// keeps its name, and mounts made by rbd-fuse are still recognised and
// released.)
//
// The image's file is <fuseDir>/<instance>/<image ID>/<image>, the image
// ID as in volume IDs (<pool>/<image> in the instance's own cluster), so
// the loop device's backing file says which image it is. The daemon's pid
// file and QMP socket are in <stateDir>/<instance>/qsd/<hash of the ID>
// (a socket's path must fit in 108 bytes).
type fuseMapper struct {
	c        *cluster
	loops    blockdev.LoopDevices
	dir      string // <fuseDir>/<instance>
	state    string // <stateDir>/<instance>/qsd
	sysRoot  string
	procRoot string // "/proc"
	// retryPause replaces pauseBeforeAsking's second when set (tests).
	retryPause time.Duration
	// served replaces the check of the image's daemon when set (tests).
	served func(r ref) (pid int, readOnly bool)
}

// qsdNode is the block node and export name inside each daemon.
const qsdNode = "image"

func (f *fuseMapper) mountDir(r ref) string { return filepath.Join(f.dir, r.idOf(f.c.cfg.ClusterID)) }
func (f *fuseMapper) file(r ref) string     { return filepath.Join(f.mountDir(r), r.image) }

// stateDir is the daemon's pid file and socket directory of r.
func (f *fuseMapper) stateDir(r ref) string {
	sum := sha256.Sum256([]byte(r.cluster + "/" + r.spec()))
	return filepath.Join(f.state, hex.EncodeToString(sum[:8]))
}

// blockdevSpec is the daemon's --blockdev for r; its beginning names the
// image, which is how a running daemon is recognised as r's.
func blockdevSpec(r ref) string {
	s := "driver=rbd,node-name=" + qsdNode + ",pool=" + r.pool
	if r.namespace != "" {
		s += ",namespace=" + r.namespace
	}
	return s + ",image=" + r.image + ","
}

// daemon returns the pid of r's running daemon (0 when none) and whether
// its export is read-only.
func (f *fuseMapper) daemon(r ref) (int, bool) {
	if f.served != nil {
		return f.served(r)
	}
	spec := blockdevSpec(r)
	pid, args := qsd.Running(filepath.Join(f.stateDir(r), "qsd.pid"), func(args []string) bool {
		return slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, spec) })
	})
	return pid, pid != 0 && slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, "writable=off") })
}

// Map serves the image's file (unless it is served) and binds a loop
// device to it. A device binding a mount of rbd-fuse that an earlier
// version made is bound to that mount's file.
func (f *fuseMapper) Map(ctx context.Context, r ref, readOnly bool, _ string) (string, error) {
	if legacy, err := f.legacyMounted(f.mountDir(r)); err != nil {
		return "", err
	} else if legacy {
		if _, err := os.Stat(f.file(r)); err != nil {
			return "", fmt.Errorf("rbd-fuse mounted %s but shows no file for image %s: %w", f.mountDir(r), r.spec(), err)
		}
		return f.loops.Attach(ctx, f.file(r), readOnly, true)
	}
	pid, daemonRO := f.daemon(r)
	if pid != 0 && daemonRO && !readOnly {
		return "", errdefs.Precondition("image %s is mapped read-only on this node; unmap it before mapping it read-write", r.spec())
	}
	started := false
	if pid == 0 {
		if err := f.start(ctx, r, readOnly); err != nil {
			return "", err
		}
		started = true
	}
	// Through the page cache: with direct I/O on qemu-storage-daemon's
	// FUSE export an ext4 made through the device did not mount again
	// (the iSCSI userspace path met it first).
	dev, err := f.loops.Attach(ctx, f.file(r), readOnly, false)
	if err != nil && started {
		if serr := f.release(context.WithoutCancel(ctx), r); serr != nil {
			err = errors.Join(err, serr)
		}
	}
	return dev, err
}

// start runs r's daemon through the daemons' runner (in the attach daemon
// when the node plugin has one: it serves the file for as long as the
// image is mapped and must outlive the node plugin). The key reaches it
// in a 0600 file removed once it has started (it reads it at start).
func (f *fuseMapper) start(ctx context.Context, r ref, readOnly bool) error {
	state, dir, file := f.stateDir(r), f.mountDir(r), f.file(r)
	if err := f.clean(r); err != nil {
		return err
	}
	ep, err := f.c.endpointOf(r.cluster)
	if err != nil {
		return err
	}
	who, err := f.c.identityFor(ctx, r.cluster)
	if err != nil {
		return err
	}
	for _, d := range []string{state, dir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		return err
	}
	// The monitors as they are now (the cluster map may move them), in a
	// config of the daemon's own, the instance's config file included.
	conf := filepath.Join(state, "ceph.conf")
	var confText strings.Builder
	confText.WriteString("[global]\n")
	if len(ep.monitors) > 0 {
		fmt.Fprintf(&confText, "mon host = %s\n", strings.Join(ep.monitors, ","))
	}
	if f.c.cfg.ConfigFile != "" {
		conf = f.c.cfg.ConfigFile
		if len(ep.monitors) > 0 {
			conf = filepath.Join(state, "ceph.conf")
			b, err := os.ReadFile(f.c.cfg.ConfigFile)
			if err != nil {
				return fmt.Errorf("read the Ceph config file %s: %w", f.c.cfg.ConfigFile, err)
			}
			confText.Reset()
			confText.Write(b)
			fmt.Fprintf(&confText, "\n[global]\nmon host = %s\n", strings.Join(ep.monitors, ","))
		}
	}
	if conf != f.c.cfg.ConfigFile {
		if err := os.WriteFile(conf, []byte(confText.String()), 0o600); err != nil {
			return err
		}
	}
	blockdev := blockdevSpec(r) + "conf=" + conf
	var args []string
	if !who.fromConfig {
		key, err := f.c.keyValue(who)
		if err != nil {
			return err
		}
		keyDir, err := os.MkdirTemp(f.c.keyRoot, keyDirPrefix)
		if err != nil {
			return fmt.Errorf("create a private directory for the cephx key: %w", err)
		}
		defer os.RemoveAll(keyDir)
		keyFile := filepath.Join(keyDir, "key")
		if err := os.WriteFile(keyFile, []byte(key), 0o600); err != nil {
			return fmt.Errorf("write the cephx key file: %w", err)
		}
		args = append(args, "--object", "secret,id=key,format=base64,file="+keyFile)
		blockdev += ",user=" + who.user + ",key-secret=key"
	}
	writable := "on"
	if readOnly {
		blockdev += ",read-only=on"
		writable = "off"
	}
	args = append(args,
		"--blockdev", blockdev,
		"--export", fmt.Sprintf("type=fuse,id=%s,node-name=%s,mountpoint=%s,writable=%s", qsdNode, qsdNode, file, writable),
		"--chardev", "socket,id=qmp,server=on,wait=off,path="+filepath.Join(state, "qmp.sock"),
		"--monitor", "chardev=qmp",
		"--pidfile", filepath.Join(state, "qsd.pid"),
		"--daemonize",
	)
	release, err := f.c.acquireSlot(ctx)
	if err != nil {
		return err
	}
	defer release()
	callCtx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if _, err := f.c.run.Daemons().Run(callCtx, qsd.Program, args...); err != nil {
		_ = f.clean(r)
		return startError(err, r)
	}
	return nil
}

// startError says why the daemon did not start: the cluster refused the
// key, the image does not exist, or else what it printed.
func startError(err error, r ref) error {
	stderr := command.Stderr(err)
	switch {
	case strings.Contains(stderr, "Permission denied") || strings.Contains(stderr, "error connecting"):
		return errdefs.Wrap(errdefs.ErrPrecondition, err, "%s cannot serve image %s: the cluster refused the connection (wrong key, or the user may not read the pool)", qsd.Program, r.spec())
	case strings.Contains(stderr, "No such file or directory"):
		return errdefs.Wrap(errdefs.ErrNotFound, err, "%s cannot open image %s", qsd.Program, r.spec())
	}
	return fmt.Errorf("%s for image %s: %w", qsd.Program, r.spec(), err)
}

// clean removes what a dead daemon left for r: a FUSE export that lost
// its server, the file, the state.
func (f *fuseMapper) clean(r ref) error {
	if err := qsd.Unmount(f.file(r)); err != nil {
		return err
	}
	if err := os.Remove(f.file(r)); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := os.Remove(f.mountDir(r)); err != nil && !os.IsNotExist(err) && !errors.Is(err, unix.ENOTEMPTY) {
		return err
	}
	return os.RemoveAll(f.stateDir(r))
}

// release ends what serves r's file once no device uses it: its daemon
// (whose exit closes the image, and with it its watch, before the volume
// moves to another node), or the rbd-fuse mount an earlier version made.
func (f *fuseMapper) release(ctx context.Context, r ref) error {
	if legacy, err := f.legacyMounted(f.mountDir(r)); err != nil {
		return err
	} else if legacy {
		return f.unmountLegacy(ctx, f.mountDir(r))
	}
	pid, _ := f.daemon(r)
	if err := qsd.Stop(ctx, pid, filepath.Join(f.stateDir(r), "qmp.sock")); err != nil {
		return fmt.Errorf("image %s: %w", r.spec(), err)
	}
	return f.clean(r)
}

// legacyMounted reports whether dir is an rbd-fuse mount.
func (f *fuseMapper) legacyMounted(dir string) (bool, error) {
	mounts, err := f.legacyMounts()
	return slices.Contains(mounts, dir), err
}

// legacyMounts lists the mount points of rbd-fuse mounts in this mount
// namespace.
func (f *fuseMapper) legacyMounts() ([]string, error) {
	file, err := os.Open(filepath.Join(f.procRoot, "self", "mountinfo"))
	if err != nil {
		return nil, err
	}
	defer file.Close()
	var out []string
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// mount point is field 5; the fs type follows the "-" separator.
		if len(fields) < 5 {
			continue
		}
		for i, fl := range fields {
			if fl == "-" && i+1 < len(fields) && fields[i+1] == "fuse.rbd-fuse" {
				out = append(out, fields[4])
			}
		}
	}
	return out, sc.Err()
}

// Unmap detaches the loop device and, when no other device uses the file,
// releases what serves it.
func (f *fuseMapper) Unmap(ctx context.Context, r ref, dev, _ string) error {
	if err := f.loops.Detach(ctx, dev); err != nil {
		return err
	}
	// losetup -d on a device someone holds open only arms autoclear.
	deadline := time.Now().Add(time.Second)
	for {
		d, err := f.loops.Get(ctx, dev)
		if errdefs.KindOf(err) == errdefs.ErrNotFound {
			break
		}
		if err != nil {
			return err
		}
		if same, err := f.loops.Resolve(d, f.file(r)); err != nil {
			return err
		} else if !same {
			break // released, and already bound again to something else
		}
		if time.Now().After(deadline) {
			return errdefs.Precondition("loop device %s of image %s is still held open by a process; it will be released when that process closes it", dev, r.spec())
		}
		time.Sleep(20 * time.Millisecond)
	}
	rest, err := f.loops.BoundTo(ctx, f.file(r))
	if err != nil || len(rest) > 0 {
		return err
	}
	return f.release(ctx, r)
}

// Release ends what still serves r's file on this node: Unmap releases it
// with the image's last device, but a crash between detach and release
// leaves it alone. A file a device still holds is busy: ErrPrecondition.
func (f *fuseMapper) Release(ctx context.Context, r ref) error {
	if legacy, err := f.legacyMounted(f.mountDir(r)); err != nil || legacy {
		if err != nil {
			return err
		}
		return f.unmountLegacy(ctx, f.mountDir(r))
	}
	if pid, _ := f.daemon(r); pid == 0 {
		return f.clean(r)
	}
	devs, err := f.loops.BoundTo(ctx, f.file(r))
	if err != nil {
		return err
	}
	if slices.ContainsFunc(devs, func(d blockdev.LoopDevice) bool { return !d.Deleted }) {
		return errdefs.Precondition("the FUSE export of image %s is still in use (a loop device holds its file)", r.spec())
	}
	return f.release(ctx, r)
}

// unmountLegacy unmounts an rbd-fuse mount an earlier version made and
// waits for rbd-fuse to exit.
func (f *fuseMapper) unmountLegacy(ctx context.Context, dir string) error {
	pid := f.fusePID(dir)
	// umount(2) itself, not umount(8): umount(8) stats and statfs's the
	// mount point first, and when rbd-fuse no longer answers (its client
	// was fenced: blocklisted, every call to the cluster retried forever)
	// that FUSE request waits uninterruptibly, killed or not, and so would
	// NodeUnstage. The system call never asks rbd-fuse.
	if err := unix.Unmount(dir, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		if errors.Is(err, unix.EBUSY) {
			return errdefs.Precondition("rbd-fuse mount %s is still in use (a loop device or a process holds its file open): %v", dir, err)
		}
		return fmt.Errorf("unmount rbd-fuse at %s: %w", dir, err)
	}
	if pid != "" {
		ctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		f.awaitExit(ctx, pid)
	}
	if err := os.Remove(dir); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// fusePID finds the rbd-fuse process serving dir ("" when none).
func (f *fuseMapper) fusePID(dir string) string {
	entries, _ := os.ReadDir(f.procRoot)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(f.procRoot, e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 0 && filepath.Base(args[0]) == "rbd-fuse" && slices.Contains(args, dir) {
			return e.Name()
		}
	}
	return ""
}

// awaitExit waits (up to 10 s) until the process is gone or a zombie: it
// closes the image, and with it its watch, on its way out.
func (f *fuseMapper) awaitExit(ctx context.Context, pid string) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		b, err := os.ReadFile(filepath.Join(f.procRoot, pid, "stat"))
		if err != nil {
			return
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && strings.HasPrefix(string(b[i+1:]), " Z") {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Mapped lists the loop devices bound to the image's file.
func (f *fuseMapper) Mapped(ctx context.Context, r ref) ([]mapped, error) {
	devs, err := f.boundToFile(ctx, r)
	if err != nil {
		return nil, err
	}
	var out []mapped
	for _, d := range devs {
		if d.AutoClear {
			continue
		}
		if d.Deleted {
			// A file shown "(deleted)" is still the image's when it is by
			// device and inode (resolveUnsure).
			if !f.resolveUnsure(ctx, r, &d) {
				continue
			}
		}
		out = append(out, mapped{Device: d.Path, Pool: r.pool, Namespace: r.namespace, Image: r.image, ReadOnly: d.ReadOnly})
	}
	return out, nil
}

// boundToFile lists the loop devices bound to the image's file. One bound
// through a gone mount is found by device and inode, which asks the FUSE
// server (a stat of its file), and rbd-fuse answers ENOENT while it cannot
// open the image (resolveUnsure): while the image's rbd-fuse mount is
// there and no device is found, it asks again, goneMountTries times in
// all. Taking the image for unmapped on one such answer made an upgrade's
// NodeUnstage leave the device and its rbd-fuse mount behind, and the
// volume's next stage on that node met its watcher.
func (f *fuseMapper) boundToFile(ctx context.Context, r ref) ([]blockdev.LoopDevice, error) {
	for try := 1; ; try++ {
		devs, err := f.loops.BoundTo(ctx, f.file(r))
		if err != nil || len(devs) > 0 || try == goneMountTries {
			return devs, err
		}
		if legacy, err := f.legacyMounted(f.mountDir(r)); err != nil || !legacy {
			return nil, err
		}
		if err := f.pauseBeforeAsking(ctx); err != nil {
			return nil, err
		}
	}
}

// Makes: the mapper's devices are loop devices.
func (f *fuseMapper) Makes(dev string) bool { return strings.HasPrefix(dev, "/dev/loop") }

// Identify says whether dev is a device of r: a loop device bound, by
// path or by device and inode, to r's file, which r's daemon (or an
// rbd-fuse mount of an earlier version) serves.
func (f *fuseMapper) Identify(ctx context.Context, r ref, dev string) (*mapped, error) {
	d, err := f.loops.Get(ctx, dev)
	if err != nil {
		return nil, err
	}
	if d.BackingFile != f.file(r) || d.Deleted {
		// Bound by a node plugin container that has since restarted (the
		// path starts at the root of the mount it saw), or shown
		// "(deleted)".
		if !f.resolveUnsure(ctx, r, d) {
			return nil, errdefs.NotFound("%s is bound to %q, not to the file of image %s (%s)", dev, d.BackingFile, r.spec(), f.file(r))
		}
	}
	legacy, err := f.legacyMounted(f.mountDir(r))
	if err != nil {
		return nil, err
	}
	if pid, _ := f.daemon(r); pid == 0 && !legacy {
		return nil, errdefs.NotFound("%s is bound to %s, but nothing serves that file (no %s for image %s)", dev, d.BackingFile, qsd.Program, r.spec())
	}
	return &mapped{Device: d.Path, Pool: r.pool, Namespace: r.namespace, Image: r.image, ReadOnly: d.ReadOnly}, nil
}

// resolveUnsure decides whether d, whose path sysfs shows from a mount
// that is gone ("/<image>" or "/": the path below the root of the mount the
// binding container saw) or shows "(deleted)", is bound to r's file, by
// device and inode (blockdev.LoopDevices.Resolve); then it sets d's path
// to the file and clears Deleted.
//
// rbd-fuse answered every lookup and stat of its file by opening the
// image again and answered ENOENT whenever that failed, as it did on a
// loaded cluster; the kernel then dropped the dentry the loop device held,
// which sysfs showed "(deleted)" although the file was there. So a file
// that does not match is asked again, goneMountTries times in all, a
// second apart (pauseBeforeAsking).
func (f *fuseMapper) resolveUnsure(ctx context.Context, r ref, d *blockdev.LoopDevice) bool {
	file := f.file(r)
	image := filepath.Base(file)
	if d.BackingFile != "/" && d.BackingFile != "/"+image && !(d.Deleted && d.BackingFile == file) {
		return false
	}
	for try := 1; ; try++ {
		// Compared by device and inode, whatever the path shows.
		probe := *d
		if probe.BackingFile == file {
			probe.BackingFile = "/" + image
		}
		probe.Deleted = false
		if ok, err := f.loops.Resolve(&probe, file); err == nil && ok {
			d.BackingFile, d.Deleted = probe.BackingFile, false
			return true
		}
		if try == goneMountTries || f.pauseBeforeAsking(ctx) != nil {
			return false
		}
	}
}

// goneMountTries is how many times resolveUnsure and boundToFile ask the
// FUSE server.
const goneMountTries = 3

// pauseBeforeAsking waits between two of those tries (a second, or the
// test's retryPause), or returns the context's error.
func (f *fuseMapper) pauseBeforeAsking(ctx context.Context) error {
	pause := time.Second
	if f.retryPause > 0 {
		pause = f.retryPause
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(pause):
		return nil
	}
}

// Refresh makes the device take the image's size: the daemon serves the
// size it read when it opened the image, and its block_resize is a resize
// of the image itself, so the image's size is read from the cluster (with
// the request's identity) and handed to block_resize, which for that size
// changes nothing in Ceph and updates the export; then the loop device
// re-reads its file's size. An rbd-fuse mount of an earlier version
// reports the image's size at once.
func (f *fuseMapper) Refresh(ctx context.Context, r ref, dev string) (int64, error) {
	if legacy, err := f.legacyMounted(f.mountDir(r)); err != nil {
		return 0, err
	} else if !legacy {
		cl, err := f.c.client(ctx, r.cluster)
		if err != nil {
			return 0, errdefs.Wrap(errdefs.ErrPrecondition, err, "read the size of image %s to grow its device", r.spec())
		}
		info, err := cl.StatImage(ctx, r.cephImage(), "")
		if err != nil {
			return 0, err
		}
		sock := filepath.Join(f.stateDir(r), "qmp.sock")
		had, err := qsd.NodeSize(ctx, sock, qsdNode)
		if err != nil {
			return 0, err
		}
		if int64(info.Size) > had {
			if err := qsd.Resize(ctx, sock, qsdNode, int64(info.Size)); err != nil {
				return 0, fmt.Errorf("have the export of image %s take its size %d: %w", r.spec(), info.Size, err)
			}
			if err := qsd.AwaitFileSize(f.file(r), int64(info.Size)); err != nil {
				return 0, fmt.Errorf("image %s: %w", r.spec(), err)
			}
		}
	}
	if err := f.loops.SetCapacity(ctx, dev); err != nil {
		return 0, err
	}
	return f.loops.Size(dev)
}

// Available: FUSE, loop devices, and qemu-storage-daemon where it runs (in
// the attach daemon, when the node plugin has one).
func (f *fuseMapper) Available(ctx context.Context) error {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return errdefs.Precondition("this node cannot map RBD images with rbd-fuse: /dev/fuse is missing")
	}
	if err := f.c.run.CheckDaemons(ctx, qsd.Program); err != nil {
		return errdefs.Wrap(errdefs.ErrPrecondition, err, "this node cannot map RBD images with rbd-fuse (served by %s)", qsd.Program)
	}
	return f.loops.Available()
}
