package blockdev

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// FakeLoopDevices is an in-memory loop driver for tests that cannot or should
// not bind real devices. Tests may edit Devices directly to simulate the
// kernel (a device rebound to another file, a busy device).
type FakeLoopDevices struct {
	mu      sync.Mutex
	Devices map[string]*LoopDevice // by path
	Busy    map[string]bool        // devices InUse reports as held
	Max     int                    // number of loop devices; 0 = unlimited
	next    int
	// Calls records "attach <file> ro=<bool>" (with " direct-io=off" when
	// the device is to bypass direct I/O), "detach <dev>" and
	// "set-capacity <dev>".
	Calls []string
	// Sizes are the devices' sizes in bytes, taken from the backing file
	// at attach and by SetCapacity, as the kernel does.
	Sizes map[string]int64
	// Open are devices a process holds open without O_EXCL: InUse does not
	// see them and Detach only arms autoclear, as the kernel does. Close
	// ends the hold.
	Open map[string]bool
	// Held, when set, is asked by InUse too: a fake host holds a device
	// while a filesystem on it is mounted.
	Held func(dev string) bool
	// Shown are devices whose backing file sysfs shows from a mount that
	// is gone: the file each is really bound to (ShowFromGoneMount).
	Shown map[string]string
	// Unanswered counts, per device shown from a gone mount, the next
	// Resolves that find its file unreadable (false), as a FUSE daemon that
	// answers a stat with ENOENT when it cannot reach its backend makes
	// them (rbd-fuse).
	Unanswered map[string]int
}

// ShowFromGoneMount makes dev's backing file show as the kernel shows it
// once the mount it was bound through is gone (a restarted container's):
// the path below that mount's root, here just "/" and the file's name.
func (f *FakeLoopDevices) ShowFromGoneMount(dev string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d := f.showLocked(dev); d != nil {
		d.BackingFile = "/" + filepath.Base(d.BackingFile)
	}
}

// showLocked keeps the file dev is really bound to in Shown, once, before
// its path is shown otherwise; nil when dev is not bound.
func (f *FakeLoopDevices) showLocked(dev string) *LoopDevice {
	d, ok := f.Devices[dev]
	if !ok {
		return nil
	}
	if f.Shown == nil {
		f.Shown = map[string]string{}
	}
	if _, shown := f.Shown[dev]; !shown {
		f.Shown[dev] = d.BackingFile
	}
	return d
}

// ShowDeleted makes dev's backing file show "(deleted)" although the file
// is there, as the kernel shows it once a FUSE daemon answered a lookup of
// the file with ENOENT (rbd-fuse when it cannot open its image): Resolve
// still finds the file by device and inode.
func (f *FakeLoopDevices) ShowDeleted(dev string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d := f.showLocked(dev); d != nil {
		d.Deleted = true
	}
}

// Resolve implements LoopDevices: the path, or the file a device shown
// from a gone mount is really bound to.
func (f *FakeLoopDevices) Resolve(d *LoopDevice, file string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.resolveLocked(d, file), nil
}

func (f *FakeLoopDevices) resolveLocked(d *LoopDevice, file string) bool {
	if d.BackingFile == file {
		return true
	}
	if f.Shown[d.Path] != file || !endsWithPath(file, d.BackingFile) {
		return false
	}
	if f.Unanswered[d.Path] > 0 {
		f.Unanswered[d.Path]--
		return false
	}
	d.BackingFile, d.Deleted = file, false
	return true
}

var _ LoopDevices = (*FakeLoopDevices)(nil)

// NewFakeLoopDevices returns an empty fake.
func NewFakeLoopDevices() *FakeLoopDevices {
	return &FakeLoopDevices{Devices: map[string]*LoopDevice{}, Busy: map[string]bool{}, Open: map[string]bool{}, Sizes: map[string]int64{}}
}

func (f *FakeLoopDevices) Attach(_ context.Context, file string, readOnly, directIO bool) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	call := fmt.Sprintf("attach %s ro=%t", file, readOnly)
	if !directIO {
		call += " direct-io=off"
	}
	f.Calls = append(f.Calls, call)
	if f.Max > 0 && len(f.Devices) >= f.Max {
		return "", errdefs.Exhausted("no free loop device on this node")
	}
	dev := fmt.Sprintf("/dev/loop%d", f.next)
	f.next++
	f.Devices[dev] = &LoopDevice{Path: dev, BackingFile: file, ReadOnly: readOnly}
	if f.Sizes == nil {
		f.Sizes = map[string]int64{}
	}
	f.Sizes[dev] = fileSize(file)
	return dev, nil
}

// fileSize is the size a loop device takes from its backing file: whole
// 512-byte sectors; 0 for a file that is not there (the fake binds anything).
func fileSize(file string) int64 {
	fi, err := os.Stat(file)
	if err != nil {
		return 0
	}
	return fi.Size() &^ 511
}

// SetCapacity takes the backing file's current size, as the kernel does.
func (f *FakeLoopDevices) SetCapacity(_ context.Context, dev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls = append(f.Calls, "set-capacity "+dev)
	d, ok := f.Devices[dev]
	if !ok {
		return errdefs.NotFound("loop device %s is not bound", dev)
	}
	if f.Sizes == nil {
		f.Sizes = map[string]int64{}
	}
	f.Sizes[dev] = fileSize(d.BackingFile)
	return nil
}

// Size returns the size recorded at attach or by the last SetCapacity.
func (f *FakeLoopDevices) Size(dev string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.Devices[dev]; !ok {
		return 0, errdefs.NotFound("loop device %s does not exist", dev)
	}
	return f.Sizes[dev], nil
}

func (f *FakeLoopDevices) Detach(_ context.Context, dev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls = append(f.Calls, "detach "+dev)
	if d, ok := f.Devices[dev]; ok && f.Open[dev] {
		d.AutoClear = true
		return nil
	}
	delete(f.Devices, dev)
	delete(f.Sizes, dev)
	return nil
}

// Offset makes the fake name its devices from /dev/loop<first> on, so that
// two fakes on one test host never hand out the same name.
func (f *FakeLoopDevices) Offset(first int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.next < first {
		f.next = first
	}
}

// Close ends a non-exclusive hold on dev (see Open); a device whose detach
// was deferred is released then, as the kernel does at the last close.
func (f *FakeLoopDevices) Close(dev string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.Open, dev)
	if d, ok := f.Devices[dev]; ok && d.AutoClear {
		delete(f.Devices, dev)
		delete(f.Sizes, dev)
	}
}

func (f *FakeLoopDevices) BoundTo(_ context.Context, file string) ([]LoopDevice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []LoopDevice
	for _, d := range f.Devices {
		if c := *d; f.resolveLocked(&c, file) {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

func (f *FakeLoopDevices) BoundUnder(_ context.Context, dir string) ([]LoopDevice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []LoopDevice
	for _, d := range f.Devices {
		c := *d
		if real, ok := f.Shown[d.Path]; ok {
			f.resolveLocked(&c, real) // as the real one resolves it
		}
		if filepath.Dir(c.BackingFile) == filepath.Clean(dir) {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

func (f *FakeLoopDevices) Get(_ context.Context, dev string) (*LoopDevice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.Devices[dev]
	if !ok {
		return nil, errdefs.NotFound("loop device %s is not bound", dev)
	}
	c := *d
	return &c, nil
}

func (f *FakeLoopDevices) InUse(dev string) (bool, error) {
	f.mu.Lock()
	busy, held := f.Busy[dev], f.Held
	f.mu.Unlock()
	return busy || (held != nil && held(dev)), nil
}

func (f *FakeLoopDevices) Available() error { return nil }
