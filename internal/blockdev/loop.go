package blockdev

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// LoopDevice is a bound loop device as the kernel reports it.
type LoopDevice struct {
	Path        string // /dev/loopN
	BackingFile string // resolved path of the backing file
	Deleted     bool   // the backing file was unlinked after binding
	ReadOnly    bool
	// AutoClear: the kernel releases the device at its last close. Spindle
	// never asks for it at attach time, so on one of our devices it means a
	// detach was deferred because somebody still holds the device open.
	AutoClear bool
}

// LoopDevices is the kernel's loop driver as attachers use it: the loop
// backend binds its images, the rbd-fuse and iSCSI userspace transports
// the files their daemons export, all with the same geometry (SectorSize)
// and the same proof of what a device is bound to. The real one runs
// losetup and reads sysfs; FakeLoopDevices stands in for it in tests that
// must not need root.
type LoopDevices interface {
	// Attach binds a free loop device to file and returns its path. Without
	// directIO the device goes through the page cache.
	Attach(ctx context.Context, file string, readOnly, directIO bool) (string, error)
	// Detach unbinds dev.
	Detach(ctx context.Context, dev string) error
	// BoundTo returns the devices bound to file, including those bound to
	// an unlinked file of that path (Deleted).
	BoundTo(ctx context.Context, file string) ([]LoopDevice, error)
	// BoundUnder returns the devices bound to files directly in dir
	// (unlinked ones included), for the node's inventory of its devices.
	BoundUnder(ctx context.Context, dir string) ([]LoopDevice, error)
	// Get returns the device at dev, or ErrNotFound when it is not bound.
	Get(ctx context.Context, dev string) (*LoopDevice, error)
	// Resolve reports whether d is bound to file, and then sets
	// d.BackingFile to file. The kernel shows a backing file's path as the
	// process that bound it saw it; once that process's mount of the file
	// is gone (a node plugin container that restarted took its bind mount
	// of the pool with it) the path starts at that mount's root
	// ("/pvc-….img"). Such a path must be the end of file, and the file is
	// then compared by device and inode, never by name alone, also when
	// it is shown "(deleted)" (a match clears Deleted).
	Resolve(d *LoopDevice, file string) (bool, error)
	// InUse reports whether dev is held by a mount or another exclusive user.
	InUse(dev string) (bool, error)
	// Available reports whether this node can bind loop devices at all.
	Available() error
	// SetCapacity makes dev take its backing file's current size.
	SetCapacity(ctx context.Context, dev string) error
	// Size returns dev's size in bytes.
	Size(dev string) (int64, error)
}

// SectorSize is the logical sector size of every loop device Spindle binds.
const SectorSize = 4096

// losetup is the real LoopDevices.
type losetup struct {
	run     *command.Runner
	sysRoot string // "/sys"
	devRoot string // "/dev"
	bound   bindings
	// now is the clock bindings age by (time.Now when nil); tests move it.
	now func() time.Time
}

// NewLosetup returns the real loop driver, running losetup through run.
func NewLosetup(run *command.Runner) LoopDevices { return newLosetup(run) }

func newLosetup(run *command.Runner) *losetup {
	return &losetup{run: run, sysRoot: "/sys", devRoot: "/dev"}
}

// bindingsMaxAge is how long the index of bound devices is trusted before
// a full scan of the node's loop devices rebuilds it.
const bindingsMaxAge = 10 * time.Second

// bindings indexes the loop devices by the file they are bound to, so
// that finding an image's devices costs a few sysfs reads instead of one
// per loop device on the node (a node with a thousand staged volumes has
// a thousand). It is built by a full scan and kept up by this process's
// own attaches; every device it names is read back from sysfs before it is
// reported, so a device detached or rebound meanwhile is never reported
// as the file's. A device another process binds to one of our files is
// seen at the next full scan, at most bindingsMaxAge later: Spindle's
// images are bound only by Spindle, and a restarted node plugin scans
// first.
type bindings struct {
	mu      sync.Mutex
	byFile  map[string]map[string]bool // file -> device names (loopN)
	scanned time.Time
}

// candidates returns the device names the index has for file, rebuilding
// it first when it is too old.
func (l *losetup) candidates(file string) ([]string, error) {
	l.bound.mu.Lock()
	defer l.bound.mu.Unlock()
	now := time.Now
	if l.now != nil {
		now = l.now
	}
	if l.bound.byFile == nil || now().Sub(l.bound.scanned) > bindingsMaxAge {
		all, err := l.scanNames(func(string) bool { return true })
		if err != nil {
			return nil, err
		}
		l.bound.byFile = map[string]map[string]bool{}
		for name, backing := range all {
			l.bound.addLocked(backing, name)
		}
		l.bound.scanned = now()
	}
	names := make([]string, 0, len(l.bound.byFile[file]))
	for name := range l.bound.byFile[file] {
		names = append(names, name)
	}
	sort.Strings(names)
	return names, nil
}

func (b *bindings) addLocked(file, name string) {
	if b.byFile[file] == nil {
		b.byFile[file] = map[string]bool{}
	}
	b.byFile[file][name] = true
}

// add records an attach this process made.
func (b *bindings) add(file, name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byFile != nil {
		b.addLocked(file, name)
	}
}

// forget drops an entry that sysfs no longer confirms.
func (b *bindings) forget(file, name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.byFile[file], name)
	if len(b.byFile[file]) == 0 {
		delete(b.byFile, file)
	}
}

func (l *losetup) Attach(ctx context.Context, file string, readOnly, directIO bool) (string, error) {
	// Direct I/O (the default) keeps the image's data out of the page cache
	// a second time and makes the loop device see exactly what is on the
	// backing file; a volume may opt out (MutableParamDirectIO).
	dio := "--direct-io=on"
	if !directIO {
		dio = "--direct-io=off"
	}
	// Every device gets 4 KiB logical sectors, whatever the pool: direct I/O
	// needs the sector size to be a multiple of the backing file's DIO
	// alignment, and that alignment grows from 512 bytes to the block size
	// the moment a file on xfs or btrfs shares extents with a snapshot or a
	// clone. A fixed 4 KiB keeps one geometry for an image's whole life, so
	// a filesystem made before a snapshot mounts after it.
	args := []string{"--find", "--show", dio, "--sector-size", strconv.Itoa(SectorSize)}
	if readOnly {
		args = append(args, "--read-only")
	}
	args = append(args, file)
	release, err := acquireFindSlot(ctx)
	if err != nil {
		return "", err
	}
	out, err := l.run.Run(ctx, "losetup", args...)
	release()
	if err != nil {
		if strings.Contains(command.Stderr(err), "could not find any free loop device") {
			return "", errdefs.Wrap(errdefs.ErrExhausted, err, "no free loop device on this node")
		}
		return "", err
	}
	dev := strings.TrimSpace(string(out))
	if !strings.HasPrefix(dev, l.devRoot+"/loop") {
		return "", fmt.Errorf("losetup printed %q, not a loop device", dev)
	}
	l.bound.add(file, filepath.Base(dev))
	return dev, nil
}

// findSlot lets one "losetup --find" of this process run at a time.
// Concurrent ones are all handed the same free device by the kernel
// (LOOP_CTL_GET_FREE); every one but the first then fails to bind it and
// losetup sleeps 200 ms before it looks again, so a node staging many
// volumes at once spent most of each stage asleep: 40 parallel attaches
// took 2.1 s on a 2-core machine where the same 40 in a row took 0.33 s.
// One at a time, each takes milliseconds. (Another program's losetup can
// still collide with ours; losetup's own retry covers that.)
var findSlot = make(chan struct{}, 1)

// acquireFindSlot waits for findSlot until ctx ends.
func acquireFindSlot(ctx context.Context) (release func(), err error) {
	select {
	case findSlot <- struct{}{}:
		return func() { <-findSlot }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for another loop device attach on this node: %w", ctx.Err())
	}
}

func (l *losetup) Detach(ctx context.Context, dev string) error {
	_, err := l.run.Run(ctx, "losetup", "--detach", dev)
	if err != nil && strings.Contains(command.Stderr(err), "No such device") {
		return nil // already gone
	}
	return err
}

// BoundTo reads the devices the index has for file back from sysfs and
// returns those still bound to it (see bindings), and those whose path
// sysfs shows from a mount that is gone (see Resolve).
func (l *losetup) BoundTo(_ context.Context, file string) ([]LoopDevice, error) {
	names, err := l.candidates(file)
	if err != nil {
		return nil, err
	}
	var out []LoopDevice
	for _, name := range names {
		d, err := l.device(name)
		if err != nil {
			return nil, err
		}
		if d == nil || d.BackingFile != file {
			l.bound.forget(file, name)
			continue
		}
		out = append(out, *d)
	}
	for _, name := range l.bound.shownAs(file) {
		d, err := l.device(name)
		if err != nil {
			return nil, err
		}
		if d == nil {
			continue
		}
		if ok, err := l.Resolve(d, file); err != nil {
			return nil, err
		} else if ok {
			out = append(out, *d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// shownAs returns the devices the index has under a shorter path that
// file ends with: candidates bound through a mount that is gone.
func (b *bindings) shownAs(file string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var names []string
	for shown, devs := range b.byFile {
		if shown != file && endsWithPath(file, shown) {
			for name := range devs {
				names = append(names, name)
			}
		}
	}
	sort.Strings(names)
	return names
}

// endsWithPath reports whether path ends with the whole components of
// tail, an absolute path ("/b/c" ends "/a/b/c", "/c" does not end "/a/bc").
// "/" ends every path: a mount of the file itself (qemu-storage-daemon's
// FUSE export is mounted over a file) shows as "/" once it is gone.
func endsWithPath(path, tail string) bool {
	return tail == "/" || strings.HasPrefix(tail, "/") && strings.HasSuffix(path, tail)
}

// Resolve implements LoopDevices: the path sysfs shows, or the same file
// by device and inode (LOOP_GET_STATUS64 against a stat of file).
func (l *losetup) Resolve(d *LoopDevice, file string) (bool, error) {
	if d.BackingFile == file {
		return true, nil
	}
	// A path shown "(deleted)" is compared by device and inode as well:
	// an unlinked file's inode, which the device holds, is no live file's,
	// while a FUSE file whose dentry the kernel dropped (rbd-fuse answered
	// a lookup ENOENT under load) shows "(deleted)" and is still there.
	if !endsWithPath(file, d.BackingFile) {
		return false, nil
	}
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		return false, nil // not there: not the file the device is bound to
	}
	fd, err := unix.Open(d.Path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		if DeviceGone(err) {
			return false, nil
		}
		return false, fmt.Errorf("open %s: %w", d.Path, err)
	}
	defer unix.Close(fd)
	info, err := unix.IoctlLoopGetStatus64(fd)
	if errors.Is(err, unix.ENXIO) {
		return false, nil // unbound meanwhile
	}
	if err != nil {
		return false, fmt.Errorf("LOOP_GET_STATUS64 of %s: %w", d.Path, err)
	}
	if info.Device != st.Dev || info.Inode != st.Ino {
		return false, nil
	}
	d.BackingFile, d.Deleted = file, false
	return true, nil
}

// BoundUnder implements LoopDevices with the same scan as BoundTo: the
// devices bound to a file in dir, by the path sysfs shows or, for one
// shown from a mount that is gone, by Resolve.
func (l *losetup) BoundUnder(_ context.Context, dir string) ([]LoopDevice, error) {
	dir = filepath.Clean(dir)
	devs, err := l.scan(func(path string) bool {
		return filepath.Dir(path) == dir || endsWithPath(filepath.Join(dir, filepath.Base(path)), path)
	})
	if err != nil {
		return nil, err
	}
	out := devs[:0]
	for _, d := range devs {
		if filepath.Dir(d.BackingFile) != dir {
			if ok, err := l.Resolve(&d, filepath.Join(dir, filepath.Base(d.BackingFile))); err != nil {
				return nil, err
			} else if !ok {
				continue
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// scan returns the bound devices whose backing file (without the
// " (deleted)" mark) satisfies match.
func (l *losetup) scan(match func(backingFile string) bool) ([]LoopDevice, error) {
	names, err := l.scanNames(match)
	if err != nil {
		return nil, err
	}
	var out []LoopDevice
	for _, name := range slices.Sorted(maps.Keys(names)) {
		d, err := l.device(name)
		if err != nil {
			return nil, err
		}
		if d != nil {
			out = append(out, *d)
		}
	}
	return out, nil
}

// scanNames reads /sys/block/loop*/loop/backing_file: no command, one small
// read per loop device (relative to one open /sys/block, so no path walk
// each time). It returns the names of the devices whose backing file
// (without the " (deleted)" mark) satisfies match, with that file.
func (l *losetup) scanNames(match func(backingFile string) bool) (map[string]string, error) {
	blockDir := filepath.Join(l.sysRoot, "block")
	dirfd, err := unix.Open(blockDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", blockDir, err)
	}
	defer unix.Close(dirfd)
	entries, err := os.ReadDir(blockDir)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	buf := make([]byte, unix.PathMax+len(" (deleted)")+1)
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "loop") {
			continue
		}
		backing, bound, err := readAttr(dirfd, name+"/loop/backing_file", buf)
		if err != nil {
			return nil, err
		}
		if !bound {
			continue
		}
		if path, _ := strings.CutSuffix(backing, " (deleted)"); match(path) {
			out[name] = path
		}
	}
	return out, nil
}

// Get reads one device's attributes; no scan.
func (l *losetup) Get(_ context.Context, dev string) (*LoopDevice, error) {
	name, err := l.deviceName(dev)
	if err != nil {
		return nil, err
	}
	d, err := l.device(name)
	if err != nil {
		return nil, err
	}
	if d == nil {
		return nil, errdefs.NotFound("loop device %s is not bound", dev)
	}
	return d, nil
}

// deviceName returns "loopN" for "/dev/loopN", refusing any other path, so
// that no sysfs path is built from something that is not a loop device.
func (l *losetup) deviceName(dev string) (string, error) {
	name := filepath.Base(dev)
	if !strings.HasPrefix(name, "loop") || filepath.Join(l.devRoot, name) != dev {
		return "", errdefs.InvalidArgument("%s is not a loop device path", dev)
	}
	return name, nil
}

// SetCapacity runs "losetup --set-capacity", which has the loop driver
// re-read the backing file's size (after the image was grown).
func (l *losetup) SetCapacity(ctx context.Context, dev string) error {
	if _, err := l.deviceName(dev); err != nil {
		return err
	}
	_, err := l.run.Run(ctx, "losetup", "--set-capacity", dev)
	if err != nil && strings.Contains(command.Stderr(err), "No such device") {
		return errdefs.Wrap(errdefs.ErrNotFound, err, "loop device %s is not bound", dev)
	}
	return err
}

// Size reads the device's size from sysfs, which counts 512-byte sectors
// whatever the device's block size.
func (l *losetup) Size(dev string) (int64, error) {
	name, err := l.deviceName(dev)
	if err != nil {
		return 0, err
	}
	return Size(l.sysRoot, filepath.Join(l.devRoot, name))
}

// device reads the attributes of /sys/block/<name>; nil when it is not bound.
func (l *losetup) device(name string) (*LoopDevice, error) {
	dir := filepath.Join(l.sysRoot, "block", name)
	backing, err := os.ReadFile(filepath.Join(dir, "loop", "backing_file"))
	if DeviceGone(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	d := &LoopDevice{Path: filepath.Join(l.devRoot, name)}
	d.BackingFile, d.Deleted = strings.CutSuffix(strings.TrimSpace(string(backing)), " (deleted)")
	// Read-only and autoclear decide whether a device may be handed out,
	// so a device whose state cannot be read is an error, not a guess.
	ro, err := os.ReadFile(filepath.Join(dir, "ro"))
	if err != nil {
		return nil, err
	}
	d.ReadOnly = strings.TrimSpace(string(ro)) == "1"
	ac, err := os.ReadFile(filepath.Join(dir, "loop", "autoclear"))
	if DeviceGone(err) {
		return nil, nil // unbound since backing_file was read
	}
	if err != nil {
		return nil, err
	}
	d.AutoClear = strings.TrimSpace(string(ac)) == "1"
	return d, nil
}

// DeviceGone tells whether reading a device's sysfs attribute failed
// because the device is not there (any more): an unbound loop device has no
// loop/ directory (ENOENT), and a detach or unmap that runs while we read
// removes the attributes under us, which sysfs reports as ENODEV (or
// ENXIO). Scans of a node's devices skip such a device instead of failing:
// on a busy node another volume's unstage is always detaching something.
func DeviceGone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ENODEV)
}

// readAttr reads a small sysfs attribute relative to dirfd; bound=false
// when it does not exist (an unbound loop device has no backing_file).
func readAttr(dirfd int, rel string, buf []byte) (value string, bound bool, err error) {
	fd, err := unix.Openat(dirfd, rel, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if DeviceGone(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read %s: %w", rel, err)
	}
	defer unix.Close(fd)
	n, err := unix.Read(fd, buf)
	if DeviceGone(err) {
		return "", false, nil // unbound between open and read
	}
	if err != nil {
		return "", false, fmt.Errorf("read %s: %w", rel, err)
	}
	return strings.TrimSpace(string(buf[:n])), true, nil
}

// InUse opens the device exclusively: the kernel refuses that while a
// filesystem is mounted on it (or a device mapper holds it). A plain
// "losetup -d" would not tell us: on a busy device it only arms autoclear and
// succeeds. A process holding the device open without O_EXCL is not seen
// here; Attacher.Detach catches that case after the detach (see awaitRelease).
func (l *losetup) InUse(dev string) (bool, error) { return InUse(dev) }

func (l *losetup) Available() error {
	if _, err := os.Stat(filepath.Join(l.devRoot, "loop-control")); err != nil {
		return errdefs.Wrap(errdefs.ErrUnavailable, err, "this node has no loop driver")
	}
	return nil
}
