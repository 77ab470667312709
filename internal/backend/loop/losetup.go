package loop

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

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

// loopDevices is what the attacher needs from the kernel's loop driver. The
// real one runs losetup and reads sysfs; FakeLoopDevices stands in for it in
// tests that must not need root.
type loopDevices interface {
	// Attach binds a free loop device to file (direct I/O) and returns its path.
	Attach(ctx context.Context, file string, readOnly bool) (string, error)
	// Detach unbinds dev.
	Detach(ctx context.Context, dev string) error
	// List returns every bound loop device.
	List(ctx context.Context) ([]LoopDevice, error)
	// InUse reports whether dev is held by a mount or another exclusive user.
	InUse(dev string) (bool, error)
	// Available reports whether this node can bind loop devices at all.
	Available() error
}

// losetup is the real loopDevices.
type losetup struct {
	run     *command.Runner
	sysRoot string // "/sys"
	devRoot string // "/dev"
}

func newLosetup(run *command.Runner) *losetup {
	return &losetup{run: run, sysRoot: "/sys", devRoot: "/dev"}
}

func (l *losetup) Attach(ctx context.Context, file string, readOnly bool) (string, error) {
	// Direct I/O keeps the image's data out of the page cache a second time
	// and makes the loop device see exactly what is on the backing file.
	args := []string{"--find", "--show", "--direct-io=on"}
	if readOnly {
		args = append(args, "--read-only")
	}
	args = append(args, file)
	out, err := l.run.Run(ctx, "losetup", args...)
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
	return dev, nil
}

func (l *losetup) Detach(ctx context.Context, dev string) error {
	_, err := l.run.Run(ctx, "losetup", "--detach", dev)
	if err != nil && strings.Contains(command.Stderr(err), "No such device") {
		return nil // already gone
	}
	return err
}

// List reads /sys/block/loop*/loop/backing_file: no command, and cheap enough
// to run on every attach even with hundreds of devices.
func (l *losetup) List(context.Context) ([]LoopDevice, error) {
	dirs, err := filepath.Glob(filepath.Join(l.sysRoot, "block", "loop*"))
	if err != nil {
		return nil, err
	}
	var out []LoopDevice
	for _, dir := range dirs {
		backing, err := os.ReadFile(filepath.Join(dir, "loop", "backing_file"))
		if err != nil {
			if os.IsNotExist(err) {
				continue // not bound
			}
			return nil, err
		}
		d := LoopDevice{Path: filepath.Join(l.devRoot, filepath.Base(dir))}
		d.BackingFile, d.Deleted = strings.CutSuffix(strings.TrimSpace(string(backing)), " (deleted)")
		if ro, err := os.ReadFile(filepath.Join(dir, "ro")); err == nil {
			d.ReadOnly = strings.TrimSpace(string(ro)) == "1"
		}
		if ac, err := os.ReadFile(filepath.Join(dir, "loop", "autoclear")); err == nil {
			d.AutoClear = strings.TrimSpace(string(ac)) == "1"
		}
		out = append(out, d)
	}
	return out, nil
}

// InUse opens the device exclusively: the kernel refuses that while a
// filesystem is mounted on it (or a device mapper holds it). A plain
// "losetup -d" would not tell us: on a busy device it only arms autoclear and
// succeeds. A process holding the device open without O_EXCL is not seen
// here; Attacher.Detach catches that case after the detach (see awaitRelease).
func (l *losetup) InUse(dev string) (bool, error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err == nil {
		_ = unix.Close(fd)
		return false, nil
	}
	if errors.Is(err, unix.EBUSY) {
		return true, nil
	}
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENXIO) {
		return false, nil
	}
	return false, fmt.Errorf("open %s exclusively: %w", dev, err)
}

func (l *losetup) Available() error {
	if _, err := os.Stat(filepath.Join(l.devRoot, "loop-control")); err != nil {
		return errdefs.Wrap(errdefs.ErrUnavailable, err, "this node has no loop driver")
	}
	return nil
}
