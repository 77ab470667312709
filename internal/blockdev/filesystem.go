package blockdev

import (
	"slices"
	"sort"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Filesystem describes how Spindle creates and mounts one filesystem type
// on a block device. The controller sizes volumes by it (MinBytes) and
// validates fs types against it; the node formats, mounts and grows by it.
type Filesystem struct {
	Name string
	// MinBytes is the smallest device mkfs accepts; CreateVolume rounds up to it.
	MinBytes int64
	mkfs     string
	// mkfsArgs come before the user's mkfsOptions. A fresh sparse image needs
	// no discard (it is all holes already), and lazy initialisation keeps mkfs
	// from writing zeros the image already reads as. Blocks and sectors are
	// 4 KiB, so the filesystem mounts on a device of 512-byte or 4 KiB
	// sectors alike (a loop device over a reflinked image has 4 KiB ones).
	mkfsArgs []string
	// mountOptions are always added.
	mountOptions []string
	// maxUnusedTail is how much of the end of its device a filesystem may
	// leave unused when it is made or grown to fill it (MaxUnusedTail).
	maxUnusedTail int64
}

const (
	kib = 1 << 10
	mib = 1 << 20
)

var filesystems = map[string]Filesystem{
	"ext4": {
		Name:     "ext4",
		MinBytes: 1 * mib,
		mkfs:     "mkfs.ext4",
		mkfsArgs: []string{"-q", "-b", "4096", "-m", "0", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1"},
		// mke2fs and resize2fs drop a last block group too small for its
		// own metadata: up to 2 MiB on 64 MiB..2 GiB devices, 6 MiB at
		// 43 GiB and 7 MiB at 2 TiB where the last group holds a backup
		// superblock, and by the same rule (2 + inode table + 1 + group
		// descriptors + reserved GDT + 50 blocks) under 9.3 MiB up to
		// 16 TiB with the default geometry.
		maxUnusedTail: 12 * mib,
	},
	"xfs": {
		Name:     "xfs",
		MinBytes: 300 * mib, // mkfs.xfs: "Filesystem must be larger than 300MB"
		mkfs:     "mkfs.xfs",
		mkfsArgs: []string{"-q", "-K", "-s", "size=4096"},
		// Clones and snapshots share the UUID of their source; without nouuid
		// the second one refuses to mount on the same node.
		mountOptions: []string{"nouuid"},
		// mkfs.xfs uses the whole device below 4 TiB (to the 4 KiB block);
		// from 4 TiB on it drops a last allocation group under 16 MiB,
		// which xfs_growfs then claims (it leaves less than 64 blocks), so
		// that tail makes NeedsGrow true once and never again.
		maxUnusedTail: 512 * kib,
	},
	"btrfs": {
		Name:     "btrfs",
		MinBytes: 109 * mib, // mkfs.btrfs: "minimum size for each btrfs device is 114294784"
		mkfs:     "mkfs.btrfs",
		mkfsArgs: []string{"-q", "-K"},
		// btrfs uses the whole device, rounded down to its 4 KiB sector.
		maxUnusedTail: 512 * kib,
	},
}

// DefaultFsType is used when neither the request nor the image names one.
const DefaultFsType = "ext4"

// LookupFilesystem returns the filesystem called name, DefaultFsType for
// "" (a request that leaves it to the driver), or an InvalidArgument error
// listing the supported ones.
func LookupFilesystem(name string) (Filesystem, error) {
	if name == "" {
		name = DefaultFsType
	}
	return FilesystemNamed(name)
}

// FilesystemNamed is LookupFilesystem without the default: for the
// filesystem a device or a mount holds, which always has a name.
func FilesystemNamed(name string) (Filesystem, error) {
	fs, ok := filesystems[name]
	if !ok {
		return Filesystem{}, errdefs.InvalidArgument("filesystem %q is not supported; use one of %v", name, SupportedFilesystems())
	}
	return fs, nil
}

// SupportedFilesystems lists the filesystem names, sorted.
func SupportedFilesystems() []string {
	names := make([]string, 0, len(filesystems))
	for n := range filesystems {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// MountOptions returns the options to mount fs with: the filesystem's own,
// then the caller's flags, then "ro" when readOnly; duplicates dropped.
func (fs Filesystem) MountOptions(flags []string, readOnly bool) []string {
	opts := slices.Clone(fs.mountOptions)
	for _, f := range flags {
		if !slices.Contains(opts, f) {
			opts = append(opts, f)
		}
	}
	if readOnly && !slices.Contains(opts, "ro") {
		opts = append(opts, "ro")
	}
	return opts
}

// MkfsCommand is the command that makes fs on dev: the filesystem's own
// arguments, then options (the StorageClass's mkfsOptions), then dev.
func (fs Filesystem) MkfsCommand(options []string, dev string) command.Cmd {
	return command.Cmd{Name: fs.mkfs, Args: slices.Concat(fs.mkfsArgs, options, []string{dev})}
}

// MaxUnusedTail is how much of the end of its device the filesystem may
// leave unused when it is made or grown to fill it; a bigger gap is a
// device that grew. It stays below 16 MiB, so that growing a device by
// 16 MiB or more is always noticed, and at or above what mkfs leaves on a
// device of any size, or every stage would grow (for ext4: e2fsck -f) a
// filesystem that cannot grow. The figures and how they were measured:
// internal/node's TestNeedsGrowMeasuredTails.
func (fs Filesystem) MaxUnusedTail() int64 { return fs.maxUnusedTail }

// LUKSHeaderBytes is what the LUKS2 header the node makes (internal/node's
// LUKSFormat) takes of the device: the data starts there (cryptsetup
// luksDump: "offset: 16777216 [bytes]"), so an encrypted volume's
// filesystem is that much smaller, and the controller sizes it that much
// bigger.
const LUKSHeaderBytes = 16 << 20
