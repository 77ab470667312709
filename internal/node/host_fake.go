package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// FakeHost is an in-memory Host: a tree of directories and files, a mount
// table, block devices and the filesystems on them. It behaves as the
// kernel and the tools do where the node's decisions depend on it (a
// mounted device is held, unmounting an unmounted path is fine, a mount
// point must exist, mkfs and mount need a writable device, a directory with
// entries is not removed), so tests assert on the state a call leaves, not
// on the calls it makes.
type FakeHost struct {
	mu      sync.Mutex
	entries map[string]*fakeEntry
	mounts  []*fakeMount
	// filesystems are keyed by a device's Identity, so an image attached
	// again on another device still holds what was made on it.
	filesystems map[string]*fakeFilesystem
	devices     map[string]FakeDevice // added with AddDevice
	nextIno     uint64
	nextMount   int
	// dm-crypt (host_fake_crypt.go): LUKS headers by device identity,
	// open mappings by name.
	luks             map[string]*fakeLUKS
	crypts           map[string]*fakeCryptMapping
	nextCryptMinor   uint32
	cryptUnavailable bool
	// openers are the processes that hold a device open exclusively, by
	// device path (HoldOpen).
	openers map[string][]blockdev.Opener

	// Devices answers for the device paths AddDevice did not add: a fake
	// attacher's devices (blockdev.FakeLoopDevices) appear through it.
	Devices func(path string) (FakeDevice, bool)
	// Fail makes the operation whose record (see Calls) equals the key
	// fail with the value, before it changes anything; "stat PATH" makes
	// Stat of PATH fail.
	Fail map[string]error
	// Busy makes Unmount of these targets fail as the kernel does for a
	// mount in use.
	Busy map[string]bool
	// Calls records the operations that change or probe the host, in
	// order: "probe DEV", "mkfs FS DEV", "mount DEV TARGET", "bind SOURCE
	// TARGET", "remount-ro TARGET", "unmount TARGET", "grow DEV",
	// "mounts" (a read of the whole mount table), "luksFormat DEV",
	// "luksOpen DEV NAME", "luksClose NAME", "luksResize NAME",
	// "luksAddKey DEV", "luksRemoveKey DEV", "luksTest DEV".
	Calls []string
}

// FakeDevice is a block device of a FakeHost.
type FakeDevice struct {
	Num  DevNum
	Size int64
	// Identity names the data behind the device (a loop device's backing
	// file): the filesystem made on it belongs to the identity.
	Identity string
	ReadOnly bool
}

type fakeEntry struct {
	typ  os.FileMode
	data []byte
	rdev DevNum
	ino  uint64
}

type fakeFilesystem struct {
	fsType string
	size   int64
	ino    uint64 // the root directory's inode
	// usedBytes is what Usage reports as used.
	usedBytes int64
}

type fakeMount struct {
	id       int
	target   string
	device   string // the device node the filesystem is on, or bound
	fsType   string // "" for a bind of a device node
	readOnly bool
	dead     bool
	// kernelReadOnly: the kernel made the filesystem read-only (an ext4
	// after an error), whatever the mount asked.
	kernelReadOnly bool
	num            DevNum
	rootIno        uint64
}

var _ Host = (*FakeHost)(nil)

// fakeHostDev is the device number of the filesystem the fake's own
// directories and files are on.
var fakeHostDev = DevNum{0, 40}

// NewFakeHost returns a host with nothing on it.
func NewFakeHost() *FakeHost {
	return &FakeHost{
		entries:     map[string]*fakeEntry{"/": {typ: os.ModeDir, ino: 1}},
		filesystems: map[string]*fakeFilesystem{},
		devices:     map[string]FakeDevice{},
		openers:     map[string][]blockdev.Opener{},
		nextIno:     100,
		nextMount:   1000,
		Fail:        map[string]error{},
		Busy:        map[string]bool{},
	}
}

// AddDevice adds a block device at path.
func (f *FakeHost) AddDevice(path string, d FakeDevice) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.devices[path] = d
}

// UseLoopDevices makes the fake loop drivers' devices the host's block
// devices (loopN is 7:N, with the size and read-only setting the loop
// driver gave it, and the backing file as its identity), and has each loop
// driver see a device as in use while a filesystem on it is mounted here.
// The drivers must name their devices apart (FakeLoopDevices.Offset).
func (f *FakeHost) UseLoopDevices(all ...*blockdev.FakeLoopDevices) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Devices = func(path string) (FakeDevice, bool) {
		var n uint32
		if _, err := fmt.Sscanf(filepath.Base(path), "loop%d", &n); err != nil || path != fmt.Sprintf("/dev/loop%d", n) {
			return FakeDevice{}, false
		}
		for _, loops := range all {
			d, err := loops.Get(context.Background(), path)
			if err != nil {
				continue
			}
			size, _ := loops.Size(path)
			return FakeDevice{Num: DevNum{7, n}, Size: size, Identity: d.BackingFile, ReadOnly: d.ReadOnly}, true
		}
		return FakeDevice{}, false
	}
	for _, loops := range all {
		loops.Held = func(dev string) bool {
			held, _ := f.DeviceHeld(dev)
			return held
		}
	}
}

// SetFilesystem puts a filesystem of fsType and size on the data behind
// device identity, as if it had been made there earlier ("" removes it).
func (f *FakeHost) SetFilesystem(identity, fsType string, size int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fsType == "" {
		delete(f.filesystems, identity)
		return
	}
	f.nextIno++
	f.filesystems[identity] = &fakeFilesystem{fsType: fsType, size: size, ino: f.nextIno}
}

// FilesystemOf returns the type of the filesystem on identity, or "".
func (f *FakeHost) FilesystemOf(identity string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fs := f.filesystems[identity]; fs != nil {
		return fs.fsType
	}
	return ""
}

// KillMount makes the top mount at target dead, as a filesystem whose
// transport went away (ENOTCONN on every access).
func (f *FakeHost) KillMount(target string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := f.topMount(target); m != nil {
		m.dead = true
	}
}

// MakeKernelReadOnly makes the filesystem mounted at target read-only in
// every mount of it, as ext4 does after an error with errors=remount-ro.
func (f *FakeHost) MakeKernelReadOnly(target string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	top := f.topMount(target)
	if top == nil {
		return
	}
	for _, m := range f.mounts {
		if m.device == top.device && m.fsType != "" {
			m.kernelReadOnly = true
		}
	}
}

// MountPoints lists the targets with something mounted, in mount order.
func (f *FakeHost) MountPoints() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.mounts))
	for _, m := range f.mounts {
		out = append(out, m.target)
	}
	return out
}

// record appends call to Calls and returns its injected failure, if any.
func (f *FakeHost) record(call string) error {
	f.Calls = append(f.Calls, call)
	return f.Fail[call]
}

func (f *FakeHost) device(path string) (FakeDevice, bool) {
	if d, ok := f.devices[path]; ok {
		return d, true
	}
	if d, ok := f.cryptDevice(path); ok {
		return d, true
	}
	if f.Devices != nil {
		return f.Devices(path)
	}
	return FakeDevice{}, false
}

func (f *FakeHost) topMount(path string) *fakeMount {
	path = filepath.Clean(path)
	for i := len(f.mounts) - 1; i >= 0; i-- {
		if f.mounts[i].target == path {
			return f.mounts[i]
		}
	}
	return nil
}

// parentIsDir reports whether path's parent is a directory (or a mount).
func (f *FakeHost) parentIsDir(path string) bool {
	parent := filepath.Dir(path)
	if m := f.topMount(parent); m != nil {
		return m.fsType != ""
	}
	e := f.entries[parent]
	return e != nil && e.typ == os.ModeDir
}

func (f *FakeHost) Stat(path string) (PathInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	path = filepath.Clean(path)
	if err := f.Fail["stat "+path]; err != nil {
		return PathInfo{}, &os.PathError{Op: "statx", Path: path, Err: err}
	}
	if m := f.topMount(path); m != nil {
		if m.dead {
			return PathInfo{Exists: true, Dead: true}, nil
		}
		p := PathInfo{Exists: true, MountRoot: true, ReadOnly: m.readOnly || m.kernelReadOnly}
		if m.fsType == "" { // a device node bound onto a file
			p.Type, p.Rdev, p.Dev, p.FsType = os.ModeDevice, m.num, DevNum{0, 5}, "devtmpfs"
			return p, nil
		}
		p.Type, p.Dev, p.Ino, p.FsType, p.Source = os.ModeDir, m.num, m.rootIno, m.fsType, m.num
		return p, nil
	}
	e := f.entries[path]
	if e == nil {
		if d, ok := f.device(path); ok {
			return PathInfo{Exists: true, Type: os.ModeDevice, Rdev: d.Num, Dev: DevNum{0, 5}}, nil
		}
		return PathInfo{}, nil
	}
	return PathInfo{Exists: true, Type: e.typ, Size: int64(len(e.data)), Rdev: e.rdev, Dev: fakeHostDev, Ino: e.ino}, nil
}

func (f *FakeHost) DirEmpty(path string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	path = filepath.Clean(path)
	if m := f.topMount(path); m != nil {
		return false, nil // a filesystem's root holds lost+found at least
	}
	if e := f.entries[path]; e == nil || e.typ != os.ModeDir {
		return false, &os.PathError{Op: "open", Path: path, Err: unix.ENOTDIR}
	}
	for p := range f.entries {
		if filepath.Dir(p) == path && p != path {
			return false, nil
		}
	}
	return true, nil
}

// MakeDir implements Host, creating missing parents as MkdirAll does.
func (f *FakeHost) MakeDir(path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.makeDirLocked(filepath.Clean(path))
}

func (f *FakeHost) makeDirLocked(path string) error {
	if e := f.entries[path]; e != nil || f.topMount(path) != nil {
		if e != nil && e.typ != os.ModeDir {
			return &os.PathError{Op: "mkdir", Path: path, Err: unix.EEXIST}
		}
		return nil
	}
	if err := f.makeDirLocked(filepath.Dir(path)); err != nil {
		return err
	}
	f.nextIno++
	f.entries[path] = &fakeEntry{typ: os.ModeDir, ino: f.nextIno}
	return nil
}

// MakeFile implements Host.
func (f *FakeHost) MakeFile(path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	path = filepath.Clean(path)
	if f.entries[path] != nil {
		return &os.PathError{Op: "open", Path: path, Err: os.ErrExist}
	}
	if err := f.makeDirLocked(filepath.Dir(path)); err != nil {
		return err
	}
	f.nextIno++
	f.entries[path] = &fakeEntry{ino: f.nextIno}
	return nil
}

// WriteEntry puts a file holding data (or, with typ, another kind of
// entry) at path, creating its parents: what a test finds in the way.
func (f *FakeHost) WriteEntry(path string, typ os.FileMode, data []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	path = filepath.Clean(path)
	_ = f.makeDirLocked(filepath.Dir(path))
	f.nextIno++
	f.entries[path] = &fakeEntry{typ: typ, data: slices.Clone(data), ino: f.nextIno}
}

// StageRecord reads the stage record of staging, as the node side does.
func (f *FakeHost) StageRecord(staging string) (*StageRecord, error) {
	return readStageRecord(f, staging)
}

// WriteStageRecord writes a stage record for staging, as a stage does.
func (f *FakeHost) WriteStageRecord(staging string, rec StageRecord) error {
	if err := f.MakeDir(filepath.Dir(staging)); err != nil {
		return err
	}
	return writeStageRecord(f, staging, rec)
}

// Exists reports whether an entry (not a mount) is at path.
func (f *FakeHost) Exists(path string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.entries[filepath.Clean(path)] != nil
}

func (f *FakeHost) Remove(path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	path = filepath.Clean(path)
	e := f.entries[path]
	switch {
	case e == nil:
		return &os.PathError{Op: "remove", Path: path, Err: unix.ENOENT}
	case f.topMount(path) != nil:
		return &os.PathError{Op: "remove", Path: path, Err: unix.EBUSY}
	case e.typ == os.ModeDir:
		for p := range f.entries {
			if filepath.Dir(p) == path && p != path {
				return &os.PathError{Op: "rmdir", Path: path, Err: unix.ENOTEMPTY}
			}
		}
	}
	delete(f.entries, path)
	return nil
}

func (f *FakeHost) ReadFile(path string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.entries[filepath.Clean(path)]
	if e == nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: unix.ENOENT}
	}
	if e.typ != 0 {
		return nil, &os.PathError{Op: "read", Path: path, Err: unix.EISDIR}
	}
	return slices.Clone(e.data), nil
}

func (f *FakeHost) WriteFile(path string, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	path = filepath.Clean(path)
	if err := f.record("write " + path); err != nil {
		return err
	}
	if !f.parentIsDir(path) {
		return &os.PathError{Op: "open", Path: path, Err: unix.ENOENT}
	}
	f.nextIno++
	f.entries[path] = &fakeEntry{data: slices.Clone(data), ino: f.nextIno}
	return nil
}

func (f *FakeHost) WriteRecord(path string, data []byte) error {
	if err := f.MakeDir(filepath.Dir(path)); err != nil {
		return err
	}
	return f.WriteFile(path, data)
}

func (f *FakeHost) StageRecords(root string, _ []Mount) ([]FoundStageRecord, error) {
	f.mu.Lock()
	var paths []string
	for p, e := range f.entries {
		if e.typ == 0 && strings.HasSuffix(p, stageRecordSuffix) && strings.HasPrefix(p, filepath.Clean(root)+"/") {
			paths = append(paths, strings.TrimSuffix(p, stageRecordSuffix))
		}
	}
	f.mu.Unlock()
	sort.Strings(paths)
	var out []FoundStageRecord
	for _, staging := range paths {
		if rec, err := readStageRecord(f, staging); err == nil {
			out = append(out, FoundStageRecord{StagingPath: staging, Record: *rec})
		}
	}
	return out, nil
}

func (f *FakeHost) Mounts() ([]Mount, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("mounts"); err != nil {
		return nil, err
	}
	return f.mountTable(), nil
}

// MountTable is Mounts without counting as a call: what a test looks at.
func (f *FakeHost) MountTable() []Mount {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mountTable()
}

func (f *FakeHost) mountTable() []Mount {
	out := make([]Mount, 0, len(f.mounts))
	for _, m := range f.mounts {
		opt := "rw"
		if m.readOnly {
			opt = "ro"
		}
		super := []string{"rw"}
		if m.kernelReadOnly {
			super = []string{"rw", "errors=remount-ro", "emergency_ro"}
		}
		mt := Mount{ID: m.id, Major: int(m.num.Major), Minor: int(m.num.Minor), Root: "/", Source: m.device,
			MountPoint: m.target, FsType: m.fsType, Options: []string{opt}, SuperOptions: super}
		if m.fsType == "" {
			mt.Major, mt.Minor, mt.Root, mt.Source, mt.FsType = 0, 5, "/"+filepath.Base(m.device), "udev", "devtmpfs"
		}
		out = append(out, mt)
	}
	return out
}

func (f *FakeHost) MountDevice(_ context.Context, dev, target, fsType string, options []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	target = filepath.Clean(target)
	if err := f.record("mount " + dev + " " + target); err != nil {
		return err
	}
	d, ok := f.device(dev)
	if !ok {
		return fmt.Errorf("mount: %s: special device %s does not exist", target, dev)
	}
	fs := f.filesystems[d.Identity]
	if fs == nil || fs.fsType != fsType {
		return fmt.Errorf("mount: %s: wrong fs type, bad option, bad superblock on %s", target, dev)
	}
	if e := f.entries[target]; e == nil || e.typ != os.ModeDir {
		return fmt.Errorf("mount: %s: mount point does not exist", target)
	}
	f.nextMount++
	f.mounts = append(f.mounts, &fakeMount{id: f.nextMount, target: target, device: dev, fsType: fsType,
		readOnly: d.ReadOnly || slices.Contains(options, "ro"), num: d.Num, rootIno: fs.ino})
	return nil
}

func (f *FakeHost) BindMount(ctx context.Context, source, target string, readOnly bool) error {
	f.mu.Lock()
	source, target = filepath.Clean(source), filepath.Clean(target)
	if err := f.record("bind " + source + " " + target); err != nil {
		f.mu.Unlock()
		return err
	}
	e := f.entries[target]
	var m fakeMount
	if src := f.topMount(source); src != nil {
		if e == nil || e.typ != os.ModeDir {
			f.mu.Unlock()
			return fmt.Errorf("bind %s on %s: %w", source, target, unix.ENOTDIR)
		}
		m = *src
	} else if d, ok := f.device(source); ok {
		if e == nil || e.typ != 0 {
			f.mu.Unlock()
			return fmt.Errorf("bind %s on %s: %w", source, target, unix.ENOENT)
		}
		m = fakeMount{device: source, num: d.Num, readOnly: d.ReadOnly}
	} else {
		f.mu.Unlock()
		return fmt.Errorf("bind %s on %s: %w", source, target, unix.ENOENT)
	}
	f.nextMount++
	m.id, m.target = f.nextMount, target
	f.mounts = append(f.mounts, &m)
	f.mu.Unlock()
	if readOnly {
		return f.RemountReadOnly(ctx, target)
	}
	return nil
}

func (f *FakeHost) RemountReadOnly(_ context.Context, target string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	target = filepath.Clean(target)
	if err := f.record("remount-ro " + target); err != nil {
		return err
	}
	m := f.topMount(target)
	if m == nil {
		return fmt.Errorf("make %s read-only: %w", target, unix.EINVAL)
	}
	m.readOnly = true
	return nil
}

func (f *FakeHost) Unmount(_ context.Context, target string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	target = filepath.Clean(target)
	if err := f.record("unmount " + target); err != nil {
		return err
	}
	if f.topMount(target) != nil && f.Busy[target] {
		return errdefs.Wrap(errdefs.ErrPrecondition, unix.EBUSY, "%s is still in use", target)
	}
	f.mounts = slices.DeleteFunc(f.mounts, func(m *fakeMount) bool { return m.target == target })
	return nil
}

func (f *FakeHost) Usage(path string) (FilesystemUsage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.topMount(path)
	if m == nil || m.fsType == "" {
		return FilesystemUsage{}, fmt.Errorf("statfs %s: not a filesystem of a volume", path)
	}
	d, _ := f.device(m.device)
	fs := f.filesystems[d.Identity]
	if fs == nil {
		return FilesystemUsage{}, fmt.Errorf("statfs %s: %w", path, unix.EIO)
	}
	return FilesystemUsage{TotalBytes: fs.size, UsedBytes: fs.usedBytes, AvailableBytes: fs.size - fs.usedBytes,
		TotalInodes: fs.size / 16384, AvailableInodes: fs.size / 16384}, nil
}

func (f *FakeHost) DevicePath(n DevNum) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for p, d := range f.devices {
		if d.Num == n {
			return p
		}
	}
	for name, c := range f.crypts {
		if n == (DevNum{fakeCryptMajor, c.minor}) {
			return MapperPath(name)
		}
	}
	if n.Major == 7 && f.Devices != nil { // a fake loop device
		p := fmt.Sprintf("/dev/loop%d", n.Minor)
		if d, ok := f.Devices(p); ok && d.Num == n {
			return p
		}
	}
	return ""
}

func (f *FakeHost) DeviceSize(path string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.device(path)
	if !ok {
		return 0, errdefs.InvalidArgument("%s is not a block device", path)
	}
	return d.Size, nil
}

// HoldOpen has a process hold the device at path open exclusively, as an
// mkfs does (O_EXCL): the device is held, and DeviceOpeners names it. A
// pid of 0 holds it unseen, as a process of another PID namespace would.
func (f *FakeHost) HoldOpen(path string, pid int, command string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.openers[path] = append(f.openers[path], blockdev.Opener{PID: pid, Command: command})
}

// ReleaseOpen ends every HoldOpen of the device at path: the processes exited.
func (f *FakeHost) ReleaseOpen(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.openers, path)
}

func (f *FakeHost) DeviceOpeners(path string) ([]blockdev.Opener, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []blockdev.Opener
	for _, o := range f.openers[path] {
		if o.PID != 0 {
			out = append(out, o)
		}
	}
	return out, nil
}

func (f *FakeHost) DeviceHeld(path string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cryptHolds(path) || len(f.openers[path]) > 0 {
		return true, nil
	}
	for _, m := range f.mounts {
		if m.device == path && m.fsType != "" {
			return true, nil
		}
	}
	return false, nil
}

func (f *FakeHost) Probe(_ context.Context, dev string) (blockdev.Signature, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("probe " + dev); err != nil {
		return blockdev.Signature{}, err
	}
	d, ok := f.device(dev)
	if !ok {
		// blkid exits 2, silently, for a path that is no device.
		return blockdev.Signature{}, nil
	}
	if fs := f.filesystems[d.Identity]; fs != nil {
		if fs.fsType == "gpt" {
			return blockdev.Signature{PTType: "gpt"}, nil
		}
		usage := "filesystem"
		if fs.fsType == "crypto_LUKS" {
			usage = "crypto"
		}
		return blockdev.Signature{Type: fs.fsType, Usage: usage}, nil
	}
	return blockdev.Signature{}, nil
}

func (f *FakeHost) Mkfs(_ context.Context, fs blockdev.Filesystem, _ []string, dev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("mkfs " + fs.Name + " " + dev); err != nil {
		return err
	}
	d, ok := f.device(dev)
	switch {
	case !ok:
		return fmt.Errorf("create %s filesystem on %s: no such device", fs.Name, dev)
	case d.ReadOnly:
		return fmt.Errorf("create %s filesystem on %s: %w", fs.Name, dev, unix.EROFS)
	}
	f.nextIno++
	f.filesystems[d.Identity] = &fakeFilesystem{fsType: fs.Name, size: d.Size, ino: f.nextIno}
	return nil
}

func (f *FakeHost) FilesystemSize(_ context.Context, dev, fsType string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.device(dev)
	if !ok {
		return 0, fmt.Errorf("read the size of the %s filesystem on %s: no such device", fsType, dev)
	}
	fs := f.filesystems[d.Identity]
	if fs == nil || fs.fsType != fsType {
		return 0, fmt.Errorf("read the size of the %s filesystem on %s: no %s filesystem there", fsType, dev, fsType)
	}
	return fs.size, nil
}

func (f *FakeHost) GrowFilesystem(_ context.Context, dev, fsType, mountPath string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("grow " + dev); err != nil {
		return err
	}
	if fsType != "ext4" && mountPath == "" {
		return errdefs.Precondition("%s grows only while mounted, and the filesystem on %s is not; mount it to grow it", fsType, dev)
	}
	d, ok := f.device(dev)
	if !ok {
		return fmt.Errorf("grow %s: no such device", dev)
	}
	fs := f.filesystems[d.Identity]
	if fs == nil || fs.fsType != fsType {
		return fmt.Errorf("grow the %s filesystem on %s: there is none", fsType, dev)
	}
	fs.size = d.Size
	return nil
}
