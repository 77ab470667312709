package rbd

import (
	"bufio"
	"context"
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
)

// fuseMapper exposes an image as a file with rbd-fuse and binds a loop
// device to it: a real block device on a node without the rbd or nbd
// kernel modules. Each image gets its own rbd-fuse mount (-r IMAGE) at
// <fuseDir>/<instance>/<image ID>, the image ID as in volume IDs
// (<pool>/<image> in the instance's own cluster), so the loop device's
// backing file, <that dir>/<image>, says which image it is.
type fuseMapper struct {
	c        *cluster
	loops    blockdev.LoopDevices
	dir      string // <fuseDir>/<instance>
	sysRoot  string
	procRoot string // "/proc"
	// retryPause replaces pauseBeforeAsking's second when set (tests).
	retryPause time.Duration
}

func (f *fuseMapper) mountDir(r ref) string { return filepath.Join(f.dir, r.idOf(f.c.cfg.ClusterID)) }
func (f *fuseMapper) file(r ref) string     { return filepath.Join(f.mountDir(r), r.image) }

// Map mounts the image with rbd-fuse (unless it is mounted) and binds a
// loop device to its file. rbd-fuse takes its cluster and credentials from
// CEPH_ARGS (its command line has only -c, -p and -r); the key stays in
// the per-call key file, which rbd-fuse reads once when it connects.
// attr_timeout=0 makes the file's size follow the image at once when it
// grows (Refresh).
func (f *fuseMapper) Map(ctx context.Context, r ref, readOnly bool, _ string) (string, error) {
	dir := f.mountDir(r)
	mounted, err := f.mounted(dir)
	if err != nil {
		return "", err
	}
	if !mounted {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", err
		}
		if err := f.mount(ctx, r, dir); err != nil {
			return "", err
		}
	} else if _, err := os.Stat(f.file(r)); err != nil {
		return "", fmt.Errorf("rbd-fuse mounted %s but shows no file for image %s: %w", dir, r.spec(), err)
	}
	return f.loops.Attach(ctx, f.file(r), readOnly, true)
}

// mount runs rbd-fuse, through the daemons' runner (in the attach daemon
// when the node plugin has one: rbd-fuse serves the mount for as long as
// it is mapped and must outlive the node plugin). rbd-fuse daemonizes
// first and connects to the cluster, reading its key file, only when the
// kernel's first request (FUSE_INIT) reaches it; every later request waits
// for that one. So the key file stays until a stat of the image's file
// has been answered.
func (f *fuseMapper) mount(ctx context.Context, r ref, dir string) error {
	ep, err := f.c.endpointOf(r.cluster)
	if err != nil {
		return err
	}
	cred, err := f.c.credentialsFor(ctx, r.cluster)
	if err != nil {
		return err
	}
	defer cred.cleanup()
	conf := f.c.cfg.ConfigFile
	if conf == "" {
		conf = "/dev/null"
	}
	var cephArgs []string
	if len(ep.monitors) > 0 {
		cephArgs = append(cephArgs, "-m", strings.Join(ep.monitors, ","))
	}
	if cred.user != "" {
		cephArgs = append(cephArgs, "--id", cred.user, "--keyfile", cred.keyFile)
	}
	release, err := f.c.acquireSlot(ctx)
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	args := []string{"-c", conf, "-p", r.pool}
	if r.namespace != "" {
		args = append(args, "-s", r.namespace)
	}
	_, err = f.c.run.Daemons().Exec(ctx, command.Cmd{
		Name: "rbd-fuse",
		Args: append(args, "-r", r.image, dir, "-o", "attr_timeout=0,entry_timeout=0"),
		Env:  []string{"CEPH_ARGS=" + strings.Join(cephArgs, " ")},
	})
	if err != nil {
		return classify(err)
	}
	if _, err := os.Stat(f.file(r)); err != nil {
		return fmt.Errorf("rbd-fuse mounted %s but shows no file for image %s: %w", dir, r.spec(), err)
	}
	return nil
}

// mounted reports whether dir is an rbd-fuse mount.
func (f *fuseMapper) mounted(dir string) (bool, error) {
	mounts, err := f.fuseMounts()
	return slices.Contains(mounts, dir), err
}

// fuseMounts lists the mount points of rbd-fuse mounts in this mount
// namespace.
func (f *fuseMapper) fuseMounts() ([]string, error) {
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
// unmounts rbd-fuse and waits for it to exit, so that its watch on the
// image is gone before the volume moves to another node.
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
	return f.unmount(ctx, f.mountDir(r))
}

// Release unmounts the image's rbd-fuse mount if one is left: Unmap
// unmounts it with the image's last device, but a device bound through a
// replaced node plugin's mount is found only while rbd-fuse answers a
// stat of its file, and a crash between detach and unmount leaves the
// mount alone. A mount a device still holds is busy: ErrPrecondition.
func (f *fuseMapper) Release(ctx context.Context, r ref) error {
	return f.unmount(ctx, f.mountDir(r))
}

func (f *fuseMapper) unmount(ctx context.Context, dir string) error {
	mounted, err := f.mounted(dir)
	if err != nil {
		return err
	}
	if mounted {
		pid := f.fusePID(dir)
		// umount(2) itself, not umount(8): umount(8) stats and statfs's
		// the mount point first, and when rbd-fuse no longer answers (its
		// client was fenced: blocklisted, every call to the cluster retried
		// forever) that FUSE request waits uninterruptibly, killed or not,
		// and so would NodeUnstage. The system call never asks rbd-fuse.
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
		if len(args) > 0 && filepath.Base(args[0]) == "rbd-fuse" {
			for _, a := range args {
				if a == dir {
					return e.Name()
				}
			}
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

// Mapped lists the loop devices bound to the image's rbd-fuse file.
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
			// rbd-fuse's file shown "(deleted)" is still the image's when
			// it is by device and inode (resolveUnsure).
			if id, ok := f.resolveUnsure(ctx, &d); !ok || id != strings.TrimPrefix(f.mountDir(r), f.dir+"/") {
				continue
			}
		}
		out = append(out, mapped{Device: d.Path, Pool: r.pool, Namespace: r.namespace, Image: r.image, ReadOnly: d.ReadOnly})
	}
	return out, nil
}

// boundToFile lists the loop devices bound to the image's rbd-fuse file.
// One bound through a gone mount is found by device and inode, which asks
// rbd-fuse (a stat of its file), and rbd-fuse answers ENOENT while it
// cannot open the image (resolveUnsure): while the image's rbd-fuse mount
// is there and no device is found, it asks again, goneMountTries times in
// all. Taking the image for unmapped on one such answer made an upgrade's
// NodeUnstage leave the device and its rbd-fuse mount behind, and the
// volume's next stage on that node met its watcher.
func (f *fuseMapper) boundToFile(ctx context.Context, r ref) ([]blockdev.LoopDevice, error) {
	for try := 1; ; try++ {
		devs, err := f.loops.BoundTo(ctx, f.file(r))
		if err != nil || len(devs) > 0 || try == goneMountTries {
			return devs, err
		}
		if mounted, err := f.mounted(f.mountDir(r)); err != nil || !mounted {
			return nil, err
		}
		if err := f.pauseBeforeAsking(ctx); err != nil {
			return nil, err
		}
	}
}

// Makes: rbd-fuse's devices are loop devices.
func (f *fuseMapper) Makes(dev string) bool { return strings.HasPrefix(dev, "/dev/loop") }

// Identify reads the loop device's backing file: it must be
// <dir>/<image ID>/<image> and <dir>/<image ID> an rbd-fuse mount.
func (f *fuseMapper) Identify(ctx context.Context, dev string) (*mapped, error) {
	d, err := f.loops.Get(ctx, dev)
	if err != nil {
		return nil, err
	}
	id, ok := strings.CutPrefix(filepath.Dir(d.BackingFile), f.dir+"/")
	if !ok || d.Deleted {
		// Bound by a node plugin container that has since restarted (the
		// path starts at the root of the rbd-fuse mount it saw,
		// "/<image>"), or shown "(deleted)" (resolveUnsure).
		id, ok = f.resolveUnsure(ctx, d)
	}
	r, perr := parseRef(id, f.c.cfg.ClusterID, "image")
	if !ok || perr != nil || d.BackingFile != f.file(r) {
		return nil, errdefs.NotFound("%s is bound to %q, not to an rbd-fuse file under %s", dev, d.BackingFile, f.dir)
	}
	if ok, err := f.mounted(f.mountDir(r)); err != nil || !ok {
		return nil, errdefs.NotFound("%s is bound to %s, but %s is not an rbd-fuse mount", dev, d.BackingFile, f.mountDir(r))
	}
	return &mapped{Device: d.Path, Pool: r.pool, Namespace: r.namespace, Image: r.image, ReadOnly: d.ReadOnly}, nil
}

// resolveUnsure finds the rbd-fuse mount under dir whose image file d is
// bound to, for a device whose path sysfs shows from a mount that is gone
// ("/<image>": the path below the root of the rbd-fuse mount the binding
// container saw) or shows "(deleted)". The candidates are the
// rbd-fuse mounts of that image under dir (<dir>/<pool>/<image> and the
// longer IDs' paths); the file must be the device's by device and inode
// (blockdev.LoopDevices.Resolve). It returns the mount's image ID, and
// sets d's path to the file and clears Deleted.
//
// rbd-fuse answers every lookup and stat of its file by opening the image
// again (rbd_open; attr_timeout=0 and entry_timeout=0 send each one to it)
// and answers ENOENT whenever that fails, as it does on a loaded cluster.
// A lookup answered so makes the kernel drop the dentry the loop device
// holds, which sysfs then shows "(deleted)" although the file is there and
// the device serves it: make e2e-multinode's restart test found an
// adopted rbd-fuse volume so, and every publish of it was refused. A
// candidate whose file does not match is asked again, goneMountTries
// times in all, a second apart (pauseBeforeAsking), before the device
// counts as not the image's.
func (f *fuseMapper) resolveUnsure(ctx context.Context, d *blockdev.LoopDevice) (string, bool) {
	image := filepath.Base(d.BackingFile)
	goneMount := image != "/" && d.BackingFile == "/"+image
	deletedUnderDir := d.Deleted && strings.HasPrefix(d.BackingFile, f.dir+"/")
	if !goneMount && !deletedUnderDir {
		return "", false
	}
	mounts, err := f.fuseMounts()
	if err != nil {
		return "", false
	}
	var candidates []ref
	for _, dir := range mounts {
		id, under := strings.CutPrefix(dir, f.dir+"/")
		if !under || filepath.Base(dir) != image {
			continue
		}
		r, err := parseRef(id, f.c.cfg.ClusterID, "image")
		if err != nil || f.mountDir(r) != dir {
			continue
		}
		candidates = append(candidates, r)
	}
	for try := 1; len(candidates) > 0; try++ {
		for _, r := range candidates {
			// Compared by device and inode, whatever the path shows.
			probe := *d
			probe.BackingFile, probe.Deleted = "/"+image, false
			if ok, err := f.loops.Resolve(&probe, f.file(r)); err == nil && ok {
				d.BackingFile, d.Deleted = probe.BackingFile, false
				return strings.TrimPrefix(f.mountDir(r), f.dir+"/"), true
			}
		}
		if try == goneMountTries {
			break
		}
		if f.pauseBeforeAsking(ctx) != nil {
			return "", false
		}
	}
	return "", false
}

// goneMountTries is how many times resolveUnsure and boundToFile ask
// rbd-fuse.
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

// Refresh has the loop driver re-read the file's size, which rbd-fuse
// (attr_timeout=0) reports from the image at once.
func (f *fuseMapper) Refresh(ctx context.Context, dev string) (int64, error) {
	if err := f.loops.SetCapacity(ctx, dev); err != nil {
		return 0, err
	}
	return f.loops.Size(dev)
}

// Available: FUSE, rbd-fuse (in the attach daemon, when the node plugin
// has one) and loop devices are there.
func (f *fuseMapper) Available(ctx context.Context) error {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return errdefs.Precondition("this node cannot map RBD images with rbd-fuse: /dev/fuse is missing")
	}
	if err := f.c.run.CheckDaemons(ctx, "rbd-fuse"); err != nil {
		return errdefs.Wrap(errdefs.ErrPrecondition, err, "this node cannot map RBD images with rbd-fuse")
	}
	return f.loops.Available()
}
