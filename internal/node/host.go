package node

import (
	"context"
	"fmt"
	"os"

	"github.com/spindle-csi/spindle/internal/blockdev"
)

// Host is everything the node side touches on the machine: the paths kubelet
// hands it, the mounts, the block devices, the filesystem tools (blkid,
// mkfs, the grow tools, run through command.Runner) and the stage records.
// Volumes decides; Host only does what it is told and reports what it
// finds. LinuxHost is the real one; FakeHost keeps a mount table, devices
// and files in memory, so the node's decisions are tested without root.
//
// Every per-request question is answered from the one path or device it
// is about (Stat, DeviceSize): a node holding a thousand volumes answers
// as fast as an idle one. Only Mounts and StageRecords read everything, and
// only the operators' inventory and rare fallbacks call them.
type Host interface {
	// Stat describes what is at path, never following a symlink there. A
	// missing path is Exists=false, not an error; a mount whose filesystem
	// no longer answers (ENOTCONN, ESTALE, EIO) is Dead.
	Stat(path string) (PathInfo, error)
	// DirEmpty reports whether the directory at path has no entries.
	DirEmpty(path string) (bool, error)
	// MakeDir creates the directory path, and its missing parents.
	MakeDir(path string) error
	// MakeFile creates an empty regular file at path (and its missing
	// parents); something already there is os.ErrExist.
	MakeFile(path string) error
	// Remove removes the empty directory or the regular file at path.
	Remove(path string) error
	// ReadFile and WriteFile read and atomically replace a small file (a
	// stage record).
	ReadFile(path string) ([]byte, error)
	WriteFile(path string, data []byte) error
	// WriteRecord atomically replaces the small file at path with data and
	// syncs it, making its directory (mode 0700) if missing: a record that
	// must outlive a power loss (a pre-provisioned volume's, static.go).
	WriteRecord(path string, data []byte) error
	// StageRecords finds the stage records below root (see FindStageRecords).
	StageRecords(root string, mounts []Mount) ([]FoundStageRecord, error)

	// Mounts reads the whole mount table.
	Mounts() ([]Mount, error)
	// MountDevice mounts the filesystem on dev at target (mount(8)).
	MountDevice(ctx context.Context, dev, target, fsType string, options []string) error
	// BindMount makes source visible at target, read-only if asked.
	BindMount(ctx context.Context, source, target string, readOnly bool) error
	// RemountReadOnly makes the bind mount at target read-only.
	RemountReadOnly(ctx context.Context, target string) error
	// Unmount removes every mount stacked at target; nothing mounted is
	// fine, a busy mount is ErrPrecondition.
	Unmount(ctx context.Context, target string) error
	// Usage reports the usage of the filesystem mounted at path.
	Usage(path string) (FilesystemUsage, error)

	// DevicePath names the device node of a device number ("" when the
	// number is no block device).
	DevicePath(dev DevNum) string
	// DeviceSize returns the size of the block device at path; anything
	// that is not a block device is an error.
	DeviceSize(path string) (int64, error)
	// DeviceHeld reports whether something holds the device exclusively:
	// a mounted filesystem, a device mapper, an O_EXCL open.
	DeviceHeld(path string) (bool, error)
	// DeviceOpeners lists the processes that have the device at path open
	// (as far as this process can see them: /proc of its PID namespace).
	DeviceOpeners(path string) ([]blockdev.Opener, error)

	// Probe asks blkid what dev holds (see blockdev.Blkid.Probe for the rules).
	Probe(ctx context.Context, dev string) (blockdev.Signature, error)
	// Mkfs creates fs on dev with the filesystem's own arguments and then
	// options; it is never cut short once started.
	Mkfs(ctx context.Context, fs blockdev.Filesystem, options []string, dev string) error
	// FilesystemSize returns the bytes the fsType filesystem on dev spans.
	FilesystemSize(ctx context.Context, dev, fsType string) (int64, error)
	// GrowFilesystem grows the fsType filesystem on dev to fill the
	// device; mountPath is where it is mounted read-write, or "".
	GrowFilesystem(ctx context.Context, dev, fsType, mountPath string) error

	// dm-crypt (crypt.go): LUKS2 headers made, opened and rekeyed with
	// cryptsetup, the passphrase always on its stdin or in a private file.
	// CryptAvailable is ErrPrecondition, naming the kernel module, on a
	// node whose kernel cannot open a LUKS volume.
	CryptAvailable(ctx context.Context) error
	// LUKSFormat writes a LUKS2 header on dev whose one keyslot passphrase opens.
	LUKSFormat(ctx context.Context, dev string, passphrase []byte) error
	// LUKSOpen opens the LUKS volume on dev as mapping name; a passphrase
	// that opens no keyslot is ErrPrecondition.
	LUKSOpen(ctx context.Context, dev, name string, passphrase []byte, readOnly bool) error
	// LUKSClose closes mapping name; one not open is fine, one in use ErrPrecondition.
	LUKSClose(ctx context.Context, name string) error
	// LUKSResize grows mapping name to fill its backing device.
	LUKSResize(ctx context.Context, name string) error
	// LUKSAddKey adds added to a free keyslot of dev's header, unlocking it
	// with existing; LUKSRemoveKey destroys the keyslot passphrase opens
	// (ErrNotFound when none does); LUKSTestKey says whether one does.
	LUKSAddKey(ctx context.Context, dev string, existing, added []byte) error
	LUKSRemoveKey(ctx context.Context, dev string, passphrase []byte) error
	LUKSTestKey(ctx context.Context, dev string, passphrase []byte) (bool, error)
	// CryptMapping describes the dm-crypt mapping whose device node is dev
	// (not Found when dev is none); CryptMappingByName the one of that name.
	CryptMapping(dev string) (CryptMapping, error)
	CryptMappingByName(name string) (CryptMapping, error)
}

// DevNum is a device number.
type DevNum struct{ Major, Minor uint32 }

// IsZero reports whether the number is unset (0:0 is no block device).
func (n DevNum) IsZero() bool { return n == DevNum{} }

func (n DevNum) String() string { return fmt.Sprintf("%d:%d", n.Major, n.Minor) }

// PathInfo is what Host.Stat found at a path.
type PathInfo struct {
	Exists bool
	// Dead: a mount whose filesystem no longer answers; nothing else is known.
	Dead bool
	// Type is the kind of entry: os.ModeDir, os.ModeSymlink, os.ModeDevice
	// (with os.ModeCharDevice for a character device), os.ModeSocket,
	// os.ModeNamedPipe, or 0 for a regular file.
	Type os.FileMode
	Size int64
	// Rdev is the device a device node stands for.
	Rdev DevNum
	// Dev and Ino identify the entry: the filesystem it is on, and its
	// inode there. A bind of a filesystem's root has the root's.
	Dev DevNum
	Ino uint64
	// MountRoot: the path is the root of a mount (a filesystem mounted
	// there, or a bind of a directory, a file or a device node).
	MountRoot bool
	// Of a mount root: the filesystem's type ("ext4", ...; "" unknown),
	// whether it is read-only there, and the block device it lives on
	// (zero for a filesystem on no block device, such as tmpfs).
	FsType   string
	ReadOnly bool
	Source   DevNum
}

// IsDir, IsEmptyFile and IsBlockDevice say what kind of entry it is.
func (p PathInfo) IsDir() bool       { return p.Exists && !p.Dead && p.Type == os.ModeDir }
func (p PathInfo) IsEmptyFile() bool { return p.Exists && !p.Dead && p.Type == 0 && p.Size == 0 }
func (p PathInfo) IsBlockDevice() bool {
	return p.Exists && !p.Dead && p.Type == os.ModeDevice
}

// String describes the entry for an error message.
func (p PathInfo) String() string {
	switch {
	case !p.Exists:
		return "nothing"
	case p.Dead:
		return "a dead mount"
	case p.Type == os.ModeSymlink:
		return "a symlink"
	case p.Type == os.ModeDevice|os.ModeCharDevice:
		return "a character device node (" + p.Rdev.String() + ")"
	case p.Type == os.ModeDevice:
		return "a block device node (" + p.Rdev.String() + ")"
	case p.Type == os.ModeSocket:
		return "a socket"
	case p.Type == os.ModeNamedPipe:
		return "a named pipe"
	case p.Type == os.ModeDir:
		return "a directory"
	case p.Size == 0:
		return "an empty regular file"
	}
	return fmt.Sprintf("a regular file holding %d bytes", p.Size)
}
