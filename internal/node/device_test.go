//go:build root

package node

// Tests on real loop devices with the real blkid, mkfs and mount. They need
// root and the programs hack/install-deps.sh installs, and skip, naming
// what is missing, without them.
//
// Cleanup order matters: t.Cleanup runs last-registered first, so every
// helper registers its undo right after the step it undoes. The temporary
// directory (registered first) goes last, after the loop device is detached,
// which in turn happens after everything mounted from it is unmounted.

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/testutil"

	"golang.org/x/sys/unix"
	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// ranLog records the commands a real Runner ran, as "name arg...".
type ranLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *ranLog) observe(o command.Observation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, strings.Join(append([]string{o.Name}, o.Args...), " "))
}

// names returns the program names run since the last reset.
func (l *ranLog) names() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		out = append(out, strings.Fields(line)[0])
	}
	return out
}

func (l *ranLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

func (l *ranLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = nil
}

func realHost() (*LinuxHost, *ranLog) {
	log := &ranLog{}
	return NewLinuxHost(command.New(utilexec.New(), log.observe)), log
}

// setupRunner runs the test's own setup commands (losetup), with the same
// locale and deadline rules as production.
var setupRunner = command.New(utilexec.New(), nil)

// sparseFile creates a sparse file of size bytes in dir.
func sparseFile(t *testing.T, dir string, size int64) string {
	t.Helper()
	f, err := os.CreateTemp(dir, "image-*.img")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// attachLoop attaches file to a free loop device and detaches it at cleanup.
func attachLoop(t *testing.T, file string) string {
	t.Helper()
	out, err := setupRunner.Run(context.Background(), "losetup", "--find", "--show", file)
	if err != nil {
		t.Fatalf("attach %s: %v", file, err)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if _, err := setupRunner.Run(context.Background(), "losetup", "--detach", dev); err != nil {
			t.Errorf("detach %s: %v", dev, err)
		}
	})
	return dev
}

// loopDevice is a fresh loop device over a sparse file of size bytes.
func loopDevice(t *testing.T, size int64) (dev, file string) {
	t.Helper()
	file = sparseFile(t, t.TempDir(), size)
	return attachLoop(t, file), file
}

// mountPoint creates a directory and makes sure nothing is mounted on it at
// cleanup, so a failing test leaves no mount behind.
func mountPoint(t *testing.T, d *LinuxHost, name string) string {
	t.Helper()
	dir := realDir(t, name)
	unmountAtCleanup(t, d, dir)
	return dir
}

func unmountAtCleanup(t *testing.T, d *LinuxHost, path string) {
	t.Cleanup(func() {
		if err := d.Unmount(context.Background(), path); err != nil {
			t.Errorf("cleanup: %v", err)
			_ = unix.Unmount(path, unix.MNT_DETACH)
		}
	})
}

func mustUnmount(t *testing.T, d *LinuxHost, path string) {
	t.Helper()
	if err := d.Unmount(context.Background(), path); err != nil {
		t.Fatal(err)
	}
	if m, err := d.MountAt(path); err != nil || m != nil {
		t.Fatalf("after Unmount, MountAt(%s) = %+v, %v", path, m, err)
	}
}

func fileSHA256(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

var realFilesystems = []struct {
	name string
	size int64
}{
	{"ext4", 64 * mib},
	{"xfs", 512 * mib}, // mkfs.xfs wants more than 300 MB
	{"btrfs", 256 * mib},
}

// A blank device is formatted once: the first stage runs mkfs, every later
// stage (whether the store knows about the format or not) only mounts, and
// the data written in between survives.
func TestRealStageFormatsBlankDeviceOnce(t *testing.T) {
	testutil.RequireRoot(t, "attach loop devices and mount them")
	testutil.RequireCommands(t, "losetup", "blkid", "mount", "umount")
	for _, tc := range realFilesystems {
		t.Run(tc.name, func(t *testing.T) {
			testutil.RequireCommands(t, "mkfs."+tc.name)
			ctx := context.Background()
			d, ran := realHost()
			dev, _ := loopDevice(t, tc.size)
			target := mountPoint(t, d, "globalmount")
			fs := mustFS(t, tc.name)
			major, minor, err := DeviceNumber(dev)
			if err != nil {
				t.Fatal(err)
			}

			// First stage: blank, so mkfs, then the record, then mount.
			var recordedAfter [][]string
			record := func(context.Context) error { recordedAfter = append(recordedAfter, ran.names()); return nil }
			formatted, err := stageFilesystem(ctx, d, FormatRequest{Device: dev, Filesystem: fs}, target, fs.MountOptions(nil, false), record)
			if err != nil {
				t.Fatalf("first stage: %v\nran: %q", err, ran.all())
			}
			if !formatted {
				t.Error("first stage of a blank device did not report formatting")
			}
			if got, want := ran.names(), []string{"blkid", "mkfs." + tc.name, "mount"}; !slices.Equal(got, want) {
				t.Errorf("first stage ran %q, want %q", got, want)
			}
			if len(recordedAfter) != 1 || !slices.Equal(recordedAfter[0], []string{"blkid", "mkfs." + tc.name}) {
				t.Errorf("recordFormatted calls, with the commands before each: %q; want one, after blkid and mkfs", recordedAfter)
			}
			m, err := d.MountAt(target)
			if err != nil {
				t.Fatal(err)
			}
			if m == nil || m.FsType != tc.name || !m.IsMountOf(dev, major, minor) || m.ReadOnly() {
				t.Fatalf("MountAt(%s) = %+v, want a read-write %s mount of %s (%d:%d)", target, m, tc.name, dev, major, minor)
			}
			if err := os.WriteFile(filepath.Join(target, "data"), []byte("written at first stage"), 0o600); err != nil {
				t.Fatal(err)
			}

			u, err := UsageOf(target)
			if err != nil {
				t.Fatal(err)
			}
			if u.TotalBytes <= 0 || u.TotalBytes > tc.size || u.AvailableBytes > u.TotalBytes || u.UsedBytes <= 0 || u.UsedBytes > u.TotalBytes {
				t.Errorf("usage of a fresh %d-byte %s: %+v", tc.size, tc.name, u)
			}
			// btrfs allocates inodes dynamically and reports no inode counts.
			if tc.name != "btrfs" && (u.TotalInodes <= 0 || u.UsedInodes < 2 || u.UsedInodes+u.AvailableInodes != u.TotalInodes) {
				t.Errorf("inode usage of a fresh %s holding one file: %+v", tc.name, u)
			}

			mustUnmount(t, d, target)
			if _, err := os.Stat(filepath.Join(target, "data")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the file is still visible after unmount: %v", err)
			}
			if sig, err := d.Probe(ctx, dev); err != nil || sig != (blockdev.Signature{Type: tc.name, Usage: "filesystem"}) {
				t.Fatalf("Probe after format = %+v, %v", sig, err)
			}

			// Second stage, the store never learnt of the format (a crash
			// between mkfs and the record): no mkfs, the record is made.
			ran.reset()
			recordedAfter = nil
			formatted, err = stageFilesystem(ctx, d, FormatRequest{Device: dev, Filesystem: fs}, target, fs.MountOptions(nil, false), record)
			if err != nil {
				t.Fatalf("second stage: %v", err)
			}
			if formatted {
				t.Error("second stage formatted again")
			}
			// No mkfs and no growth: only the check that the filesystem
			// still fills its device (before the mount for ext4, which
			// would grow offline; after it for xfs and btrfs).
			want := map[string][]string{
				"ext4":  {"blkid", "dumpe2fs", "mount"},
				"xfs":   {"blkid", "mount", "xfs_info"},
				"btrfs": {"blkid", "mount", "btrfs"},
			}[tc.name]
			if got := ran.names(); !slices.Equal(got, want) {
				t.Errorf("second stage ran %q, want %q", got, want)
			}
			if len(recordedAfter) != 1 {
				t.Errorf("recordFormatted called %d times, want once: the store did not know", len(recordedAfter))
			}
			if got, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(got) != "written at first stage" {
				t.Errorf("data after second stage = %q, %v", got, err)
			}
			mustUnmount(t, d, target)

			// Third stage, the store knows, read-only: mount only, read-only.
			ran.reset()
			recordedAfter = nil
			formatted, err = stageFilesystem(ctx, d, FormatRequest{Device: dev, Filesystem: fs, AlreadyFormatted: true, ReadOnly: true}, target, fs.MountOptions(nil, true), record)
			if err != nil {
				t.Fatalf("third stage: %v", err)
			}
			if formatted || len(recordedAfter) != 0 {
				t.Errorf("third stage: formatted=%v, recordFormatted called %d times; want neither", formatted, len(recordedAfter))
			}
			if got, want := ran.names(), []string{"blkid", "mount"}; !slices.Equal(got, want) {
				t.Errorf("third stage ran %q, want %q", got, want)
			}
			if m, err := d.MountAt(target); err != nil || m == nil || !m.ReadOnly() {
				t.Errorf("third stage mount = %+v, %v; want read-only", m, err)
			}
			if err := os.WriteFile(filepath.Join(target, "more"), nil, 0o600); !errors.Is(err, syscall.EROFS) {
				t.Errorf("write on a read-only stage = %v, want EROFS", err)
			}
			if got, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(got) != "written at first stage" {
				t.Errorf("data after third stage = %q, %v", got, err)
			}
		})
	}
}

// A device holding xfs, staged as ext4 (or btrfs), is refused and left
// exactly as it was.
func TestRealRefusesOtherFilesystem(t *testing.T) {
	testutil.RequireRoot(t, "attach loop devices and mount them")
	testutil.RequireCommands(t, "losetup", "blkid", "mount", "umount", "mkfs.xfs")
	ctx := context.Background()
	d, ran := realHost()
	dev, file := loopDevice(t, 512*mib)
	target := mountPoint(t, d, "globalmount")
	xfs := mustFS(t, "xfs")
	if _, err := stageFilesystem(ctx, d, FormatRequest{Device: dev, Filesystem: xfs}, target, xfs.MountOptions(nil, false), func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("xfs data"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustUnmount(t, d, target)
	before := fileSHA256(t, file)

	for _, other := range []string{"ext4", "btrfs"} {
		ran.reset()
		fs := mustFS(t, other)
		recorded := false
		formatted, err := stageFilesystem(ctx, d, FormatRequest{Device: dev, Filesystem: fs}, target, fs.MountOptions(nil, false), func(context.Context) error { recorded = true; return nil })
		if !errors.Is(err, errdefs.ErrPrecondition) {
			t.Fatalf("staging xfs as %s: err = %v, want a precondition failure", other, err)
		}
		if !strings.Contains(err.Error(), "xfs filesystem") || !strings.Contains(err.Error(), dev) {
			t.Errorf("error %q should name the device and what it holds", err)
		}
		if formatted || recorded {
			t.Errorf("formatted=%v recorded=%v on a refused device", formatted, recorded)
		}
		if got := ran.names(); !slices.Equal(got, []string{"blkid"}) {
			t.Errorf("refusal ran %q, want blkid only", got)
		}
		if m, err := d.MountAt(target); err != nil || m != nil {
			t.Errorf("refused device mounted: %+v, %v", m, err)
		}
	}
	if fileSHA256(t, file) != before {
		t.Fatal("the image changed although the stage was refused")
	}

	if _, err := stageFilesystem(ctx, d, FormatRequest{Device: dev, Filesystem: xfs, AlreadyFormatted: true}, target, xfs.MountOptions(nil, true), nil); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(got) != "xfs data" {
		t.Errorf("xfs data after the refusals = %q, %v", got, err)
	}
}

// writeDOSTable writes an MBR with one Linux partition (start 2048, the
// rest of the disk) to f.
func writeDOSTable(f *os.File, sectors int64) error {
	mbr := make([]byte, 512)
	entry := mbr[446:462]
	entry[0] = 0x00 // not bootable
	entry[4] = 0x83 // Linux
	binary.LittleEndian.PutUint32(entry[8:], 2048)
	binary.LittleEndian.PutUint32(entry[12:], uint32(sectors-2048))
	binary.LittleEndian.PutUint32(mbr[440:], 0x1c2d3e4f) // disk identifier
	mbr[510], mbr[511] = 0x55, 0xAA
	_, err := f.WriteAt(mbr, 0)
	return err
}

// writeGPT writes a protective MBR and a primary GPT with one Linux
// partition to f. Only the primary header is written; blkid trusts it when
// its checksums are right.
func writeGPT(f *os.File, sectors int64) error {
	const entries, entrySize = 128, 128
	pmbr := make([]byte, 512)
	e := pmbr[446:462]
	e[2], e[4] = 0x02, 0xEE // CHS start 0/0/2, type "GPT protective"
	e[5], e[6], e[7] = 0xFF, 0xFF, 0xFF
	binary.LittleEndian.PutUint32(e[8:], 1)
	binary.LittleEndian.PutUint32(e[12:], uint32(min(sectors-1, 0xFFFFFFFF)))
	pmbr[510], pmbr[511] = 0x55, 0xAA

	table := make([]byte, entries*entrySize)
	p := table[:entrySize]
	// Linux filesystem data: 0FC63DAF-8483-4772-8E79-3D69D8477DE4, mixed endian.
	copy(p[0:16], []byte{0xAF, 0x3D, 0xC6, 0x0F, 0x83, 0x84, 0x72, 0x47, 0x8E, 0x79, 0x3D, 0x69, 0xD8, 0x47, 0x7D, 0xE4})
	copy(p[16:32], []byte("spindle-test-prt")) // unique partition GUID
	binary.LittleEndian.PutUint64(p[32:], 2048)
	binary.LittleEndian.PutUint64(p[40:], uint64(sectors-34))

	hdr := make([]byte, 92)
	copy(hdr[0:8], "EFI PART")
	binary.LittleEndian.PutUint32(hdr[8:], 0x00010000)
	binary.LittleEndian.PutUint32(hdr[12:], 92)
	binary.LittleEndian.PutUint64(hdr[24:], 1)                         // this header
	binary.LittleEndian.PutUint64(hdr[32:], uint64(sectors-1))         // backup header
	binary.LittleEndian.PutUint64(hdr[40:], 34)                        // first usable
	binary.LittleEndian.PutUint64(hdr[48:], uint64(sectors-34))        // last usable
	copy(hdr[56:72], []byte("spindle-test-dsk"))                       // disk GUID
	binary.LittleEndian.PutUint64(hdr[72:], 2)                         // entries start
	binary.LittleEndian.PutUint32(hdr[80:], entries)                   // number of entries
	binary.LittleEndian.PutUint32(hdr[84:], entrySize)                 // entry size
	binary.LittleEndian.PutUint32(hdr[88:], crc32.ChecksumIEEE(table)) // entries checksum
	binary.LittleEndian.PutUint32(hdr[16:], crc32.ChecksumIEEE(hdr))   // header checksum, computed with itself zero

	for _, w := range []struct {
		b   []byte
		off int64
	}{{pmbr, 0}, {hdr, 512}, {table, 1024}} {
		if _, err := f.WriteAt(w.b, w.off); err != nil {
			return err
		}
	}
	return nil
}

// A device holding a partition table is refused and left untouched.
func TestRealRefusesPartitionTable(t *testing.T) {
	testutil.RequireRoot(t, "attach loop devices and mount them")
	testutil.RequireCommands(t, "losetup", "blkid", "mount", "umount", "mkfs.ext4")
	const size = 64 * mib
	tests := []struct {
		name   string
		write  func(*os.File, int64) error
		ptType string
	}{
		{"dos", writeDOSTable, "dos"},
		{"gpt", writeGPT, "gpt"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			d, ran := realHost()
			file := sparseFile(t, t.TempDir(), size)
			f, err := os.OpenFile(file, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			err = tc.write(f, size/512)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
			before := fileSHA256(t, file)
			dev := attachLoop(t, file)
			// The hand-made table must be what blkid sees, or the test
			// below proves nothing.
			if sig, err := d.Probe(ctx, dev); err != nil || sig.PTType != tc.ptType {
				t.Fatalf("blkid does not see the %s table written by the test: %+v, %v", tc.ptType, sig, err)
			}
			target := mountPoint(t, d, "globalmount")
			ran.reset()

			ext4 := mustFS(t, "ext4")
			formatted, err := stageFilesystem(ctx, d, FormatRequest{Device: dev, Filesystem: ext4}, target, nil, func(context.Context) error {
				t.Error("recordFormatted called for a refused device")
				return nil
			})
			if !errors.Is(err, errdefs.ErrPrecondition) {
				t.Fatalf("err = %v, want a precondition failure", err)
			}
			if want := "a " + tc.ptType + " partition table"; !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
			if formatted {
				t.Error("formatted a device holding a partition table")
			}
			if got := ran.names(); !slices.Equal(got, []string{"blkid"}) {
				t.Errorf("refusal ran %q, want blkid only", got)
			}
			if fileSHA256(t, file) != before {
				t.Error("the image changed although the stage was refused")
			}
		})
	}
}

// blkid -p exits 2, silently, for a path that does not exist, exactly as
// for a blank device; what keeps that from doing harm is that mkfs then
// fails without creating anything at the path. Pin that down for every
// filesystem, so that a change to the mkfs arguments (a size, -f) cannot
// turn a missing device into a new image file.
func TestRealStageOfMissingDeviceFails(t *testing.T) {
	testutil.RequireCommands(t, "blkid")
	for _, tc := range realFilesystems {
		t.Run(tc.name, func(t *testing.T) {
			testutil.RequireCommands(t, "mkfs."+tc.name)
			d, ran := realHost()
			missing := filepath.Join(t.TempDir(), "no-such-device")
			fs := mustFS(t, tc.name)
			formatted, err := stageFilesystem(context.Background(), d, FormatRequest{Device: missing, Filesystem: fs}, t.TempDir(), nil, func(context.Context) error {
				t.Error("recordFormatted called for a missing device")
				return nil
			})
			if err == nil || formatted {
				t.Fatalf("StageFilesystem on a missing device = %v, %v; want an error", formatted, err)
			}
			if !strings.Contains(err.Error(), missing) {
				t.Errorf("error %q does not name the device", err)
			}
			if got := ran.names(); slices.Contains(got, "mount") {
				t.Errorf("ran %q: mount after a failed stage", got)
			}
			if _, err := os.Lstat(missing); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("staging a missing device created %s: %v", missing, err)
			}
		})
	}
}

// Device numbers and sizes come from the kernel's view of a real device.
func TestRealDeviceNumberAndSize(t *testing.T) {
	testutil.RequireRoot(t, "attach loop devices and mount them")
	testutil.RequireCommands(t, "losetup")
	const size = 48*mib + 4096
	dev, file := loopDevice(t, size)

	major, minor, err := DeviceNumber(dev)
	if err != nil {
		t.Fatal(err)
	}
	sysDev, err := os.ReadFile(filepath.Join("/sys/class/block", filepath.Base(dev), "dev"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprintf("%d:%d", major, minor), strings.TrimSpace(string(sysDev)); got != want {
		t.Errorf("DeviceNumber(%s) = %s, sysfs says %s", dev, got, want)
	}
	bMajor, bMinor, ok, err := BlockDeviceAt(dev)
	if err != nil || !ok || bMajor != major || bMinor != minor {
		t.Errorf("BlockDeviceAt(%s) = %d:%d %v %v, want %d:%d true", dev, bMajor, bMinor, ok, err, major, minor)
	}
	got, err := blockdev.SizeOfNumber(major, minor)
	if err != nil {
		t.Fatal(err)
	}
	if got != size {
		t.Errorf("SizeOfNumber = %d, want the image size %d", got, size)
	}

	if _, _, ok, err := BlockDeviceAt(file); ok || err != nil {
		t.Errorf("BlockDeviceAt(regular file) = %v, %v; want false, nil", ok, err)
	}
	if _, _, _, err := BlockDeviceAt(file + ".missing"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("BlockDeviceAt(missing) = %v, want not exist", err)
	}
	if _, _, err := DeviceNumber(file); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("DeviceNumber(regular file) = %v, want invalid argument", err)
	}
	if _, err := blockdev.SizeOfNumber(4095, 4095); err == nil {
		t.Error("SizeOfNumber of a device that does not exist succeeded")
	}
}

// Bind mounts as Publish uses them: a read-only bind of the staging path, a
// device bound onto a file (block volumes), and Unmount of stacked binds.
func TestRealBindMountsAndStackedUnmount(t *testing.T) {
	testutil.RequireRoot(t, "attach loop devices and mount them")
	testutil.RequireCommands(t, "losetup", "blkid", "mount", "umount", "mkfs.ext4")
	ctx := context.Background()
	d, _ := realHost()
	dev, _ := loopDevice(t, 64*mib)
	staging := mountPoint(t, d, "globalmount")
	ext4 := mustFS(t, "ext4")
	if _, err := stageFilesystem(ctx, d, FormatRequest{Device: dev, Filesystem: ext4}, staging, nil, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(staging, "data"), []byte("staged"), 0o600); err != nil {
		t.Fatal(err)
	}

	pod := mountPoint(t, d, "pod mount") // a space: mountinfo escapes it
	if err := d.BindMount(ctx, staging, pod, true); err != nil {
		t.Fatal(err)
	}
	m, err := d.MountAt(pod)
	if err != nil || m == nil || !m.ReadOnly() || m.FsType != "ext4" {
		t.Fatalf("MountAt(%q) = %+v, %v; want a read-only ext4 bind", pod, m, err)
	}
	if got, err := os.ReadFile(filepath.Join(pod, "data")); err != nil || string(got) != "staged" {
		t.Errorf("data through the bind = %q, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(pod, "data"), []byte("x"), 0o600); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write through a read-only bind = %v, want EROFS", err)
	}
	// The staging mount itself stays writable.
	if s, err := d.MountAt(staging); err != nil || s == nil || s.ReadOnly() {
		t.Errorf("staging mount after a read-only bind = %+v, %v", s, err)
	}

	// A second, writable bind on top: Unmount removes both layers.
	if err := d.BindMount(ctx, staging, pod, false); err != nil {
		t.Fatal(err)
	}
	var layers int
	mounts, err := d.Mounts()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if m.MountPoint == pod {
			layers++
		}
	}
	if layers != 2 {
		t.Fatalf("%d mounts at %q, want 2 stacked", layers, pod)
	}
	mustUnmount(t, d, pod)

	// Block volume publish: the device node bound onto a file.
	blockTarget := filepath.Join(realDir(t, "block"), "pvc-1")
	if err := os.WriteFile(blockTarget, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	unmountAtCleanup(t, d, blockTarget)
	if err := d.BindMount(ctx, dev, blockTarget, false); err != nil {
		t.Fatal(err)
	}
	major, minor, err := DeviceNumber(dev)
	if err != nil {
		t.Fatal(err)
	}
	bMajor, bMinor, ok, err := BlockDeviceAt(blockTarget)
	if err != nil || !ok || bMajor != major || bMinor != minor {
		t.Errorf("BlockDeviceAt(bound file) = %d:%d %v %v, want %d:%d", bMajor, bMinor, ok, err, major, minor)
	}
	mustUnmount(t, d, blockTarget)
	if _, _, ok, err := BlockDeviceAt(blockTarget); ok || err != nil {
		t.Errorf("after unmount the file is still a device: %v %v", ok, err)
	}
	if err := removeMountPoint(d, "target_path", blockTarget); err != nil {
		t.Error(err)
	}

	// Busy: a process holding a file open keeps umount from succeeding.
	f, err := os.Open(filepath.Join(staging, "data"))
	if err != nil {
		t.Fatal(err)
	}
	err = d.Unmount(ctx, staging)
	f.Close()
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "still in use") {
		t.Errorf("Unmount of a busy mount = %v, want a precondition failure saying it is in use", err)
	}
	mustUnmount(t, d, staging)
}
