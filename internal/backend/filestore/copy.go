package filestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Clones and snapshots are copies of an image file. Two ways to copy:
//
//   - A reflink (FICLONE) shares the source's extents. It is instant, takes
//     no space until either file is written, and is atomic against writes to
//     the source: the kernel holds the inode lock and drains direct I/O (the
//     loop driver's) for the duration, and flushes the page cache of a
//     buffered writer on this host first. So it is a point-in-time copy even
//     of a volume that a node is writing right now.
//   - A sparse copy reads the data extents (SEEK_DATA/SEEK_HOLE) and writes
//     them; holes stay holes. It takes time proportional to the data and
//     sees writes made while it runs, so a copy of an image in use would mix
//     old and new blocks: a torn filesystem, not a snapshot.
//
// A reflink is tried first; the pool filesystem answers whether it can
// (xfs with reflink=1 and btrfs can; ext4, tmpfs and most others cannot).
// When it cannot and the source is a volume published to some node, the copy
// is refused (ErrPrecondition) rather than made torn. A snapshot is never
// written, so it can always be copied.
//
// Copies run under the pool lock, like every create. A reflink is over in
// milliseconds; a sparse copy holds the lock for as long as it takes to copy
// the source's data (seconds for a few GiB), and every other metadata change
// in the pool (publish, unpublish, create, RecordFormatted) waits that long
// and may time out with ErrBusy, to be retried. Copying outside the lock
// would need a second kind of half-made file for the sweep to tell apart.

// copyMethod is how copyImage made its copy.
type copyMethod int

const (
	copyReflink copyMethod = iota + 1
	copySparse
)

func (m copyMethod) String() string {
	switch m {
	case copyReflink:
		return "reflink"
	case copySparse:
		return "sparse copy"
	}
	return "no copy"
}

// copyChunk is the unit a sparse copy reads and writes.
const copyChunk = 1 << 20

// zeroChunk is compared against, so that zeroed blocks inside data extents
// stay holes in the copy too.
var zeroChunk = make([]byte, copyChunk)

// copySource is what a clone or snapshot copies: a volume's image or a
// snapshot's, as its record describes it.
type copySource struct {
	what string // "volume pvc-a", "snapshot snapshot-1", for messages
	path string
	// CopySource: the recorded size (the copy holds this much of the
	// file), access type and fs type.
	backend.CopySource
	formatted bool
	// publishedTo are the nodes that may be writing the source right now:
	// a volume's attachments; never any for a snapshot.
	publishedTo []string
}

// validSource checks that a content source names exactly one thing, by an ID
// that is safe to build paths from.
func validSource(src *backend.ContentSource) error {
	switch {
	case src == nil:
		return nil
	case src.SnapshotID != "" && src.ImageID != "":
		return errdefs.InvalidArgument("a volume is copied from a snapshot or from a volume, not both (snapshot %q, volume %q)", src.SnapshotID, src.ImageID)
	case src.SnapshotID != "":
		return validID(src.SnapshotID)
	case src.ImageID != "":
		return validID(src.ImageID)
	}
	return errdefs.InvalidArgument("the content source names neither a snapshot nor a volume")
}

// volumeSource reads a volume as a copy source. The caller holds the pool lock.
func (s *Store) volumeSource(id string) (*copySource, error) {
	rec, err := s.read(id)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && rec.State != stateReady) {
		return nil, errdefs.NotFound("source volume %s does not exist in %s", id, s.name)
	}
	if err != nil {
		return nil, err
	}
	src := &copySource{
		what:       "volume " + id,
		path:       s.ImagePath(id),
		CopySource: backend.CopySource{SizeBytes: rec.CapacityBytes, AccessType: rec.AccessType, FsType: rec.FsType},
		formatted:  rec.Formatted,
	}
	for _, a := range rec.Attachments {
		src.publishedTo = append(src.publishedTo, a.NodeID)
	}
	return src, nil
}

// snapshotSource reads a snapshot as a copy source. The caller holds the pool lock.
func (s *Store) snapshotSource(id string) (*copySource, error) {
	rec, err := s.readSnapshot(id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, errdefs.NotFound("source snapshot %s does not exist in %s", id, s.name)
	}
	if err != nil {
		return nil, err
	}
	return &copySource{
		what:       "snapshot " + id,
		path:       s.snapshotImagePath(id),
		CopySource: backend.CopySource{SizeBytes: rec.SizeBytes, AccessType: rec.AccessType, FsType: rec.FsType},
		formatted:  rec.Formatted,
	}, nil
}

// createCopy makes img a copy of source, grown to img.CapacityBytes, and
// writes its record. The copy keeps the source's access type, filesystem and
// "formatted" flag: a restored volume must never be formatted again. The
// caller holds the pool lock; a failure leaves nothing behind.
func (s *Store) createCopy(ctx context.Context, img backend.Image, spec backend.VolumeSpec) (*backend.Image, error) {
	source := *spec.Source
	var src *copySource
	var err error
	if source.SnapshotID != "" {
		src, err = s.snapshotSource(source.SnapshotID)
	} else {
		src, err = s.volumeSource(source.ImageID)
	}
	if err != nil {
		return nil, err
	}
	if err := backend.CopyFits(spec, src.CopySource); err != nil {
		return nil, err
	}
	if src.FsType != "" {
		img.FsType = src.FsType
	}
	img.Formatted = src.formatted
	img.Source = &source
	if err := s.checkSpace(img.CapacityBytes); err != nil {
		return nil, err
	}
	if _, err := s.copyImage(ctx, s.ImagePath(img.ID), src, img.CapacityBytes); err != nil {
		return nil, err
	}
	if err := s.write(&record{State: stateReady, Image: img}); err != nil {
		err = spaceError(err, "write metadata of %s", img.ID)
		if cleanupErr := s.removeFiles(img.ID); cleanupErr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", cleanupErr))
		}
		return nil, err
	}
	return img.Clone(), nil
}

// copyImage creates dst as a copy of src's first src.SizeBytes bytes, grown
// to sizeBytes, and syncs it. On failure dst is removed.
func (s *Store) copyImage(ctx context.Context, dst string, src *copySource, sizeBytes int64) (copyMethod, error) {
	in, err := os.Open(src.path)
	if os.IsNotExist(err) {
		return 0, errdefs.Wrap(errdefs.ErrPrecondition, err, "the image file of %s is missing; its data is gone", src.what)
	}
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", src.what, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return 0, spaceError(err, "create the copy of %s", src.what)
	}
	method, err := s.copyData(ctx, out, in, src)
	if err == nil {
		if err = out.Truncate(sizeBytes); err != nil {
			err = sizeError(err, sizeBytes, "grow the copy of %s", src.what)
		}
	}
	if err == nil {
		if err = out.Sync(); err != nil {
			err = spaceError(err, "sync the copy of %s", src.what)
		}
	}
	if closeErr := out.Close(); err == nil && closeErr != nil {
		err = spaceError(closeErr, "close the copy of %s", src.what)
	}
	if err != nil {
		if rmErr := removeIfExists(dst); rmErr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", rmErr))
		}
		return 0, err
	}
	return method, nil
}

// copyData fills the empty file dst with src's recorded content: a reflink
// where the pool can make one, else a sparse copy if the source is not in use
// (see the comment at the top of this file).
func (s *Store) copyData(ctx context.Context, dst, src *os.File, source *copySource) (copyMethod, error) {
	err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd()))
	if err == nil {
		// The clone has the source file's length, which is more than its
		// record says after an interrupted Expand; the copy is what the
		// record says.
		if err := dst.Truncate(source.SizeBytes); err != nil {
			return 0, spaceError(err, "size the copy of %s", source.what)
		}
		return copyReflink, nil
	}
	if !cannotReflink(err) {
		return 0, spaceError(err, "reflink %s", source.what)
	}
	if len(source.publishedTo) > 0 {
		return 0, errdefs.Precondition("%s is published to node(s) %s, and pool %s is on %s, which cannot reflink: a plain copy of an image that a node may be writing meanwhile is not a point-in-time copy. "+
			"Unpublish the volume (stop the pods that use it) and retry, or put the pool on xfs (reflink=1) or btrfs, where the copy is instant and atomic",
			source.what, strings.Join(source.publishedTo, ", "), s.name, fsName(s.dir))
	}
	if err := s.checkCopySpace(src, source); err != nil {
		return 0, err
	}
	if err := sparseCopy(ctx, dst, src, source.SizeBytes); err != nil {
		return 0, fmt.Errorf("copy %s: %w", source.what, err)
	}
	return copySparse, nil
}

// cannotReflink tells "this filesystem (or this pair of files) cannot share
// extents" from a real failure. EOPNOTSUPP is the usual answer (ext4, tmpfs,
// xfs without reflink); EXDEV comes from files on different mounts; ENOTTY,
// ENOSYS and EINVAL from filesystems and kernels that do not know the ioctl
// or refuse it for these files. All of them leave dst untouched.
func cannotReflink(err error) bool {
	for _, errno := range []syscall.Errno{unix.EOPNOTSUPP, unix.EXDEV, unix.ENOTTY, unix.ENOSYS, unix.EINVAL} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

// checkCopySpace refuses a sparse copy whose data cannot fit: it needs as
// much free space as the source has allocated.
func (s *Store) checkCopySpace(src *os.File, source *copySource) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil {
		return fmt.Errorf("stat %s: %w", source.what, err)
	}
	free, err := s.FreeBytes()
	if err != nil {
		return err
	}
	if used := st.Blocks * 512; used > free {
		return errdefs.Exhausted("pool %s has %d bytes free; copying the %d bytes of data of %s does not fit", s.name, free, used, source.what)
	}
	return nil
}

// sparseCopy makes dst hold src's first size bytes, copying only what
// SEEK_DATA reports as data (and, of that, only the chunks that are not all
// zeros): a hole in src stays a hole in dst, so a mostly empty image stays
// mostly unallocated. dst must be empty. Reads and writes go through pread
// and pwrite, not copy_file_range, which some filesystems would turn into a
// whole-file server-side copy without regard for holes.
func sparseCopy(ctx context.Context, dst, src *os.File, size int64) error {
	if err := dst.Truncate(size); err != nil {
		return spaceError(err, "size the copy")
	}
	fd := int(src.Fd())
	buf := make([]byte, copyChunk)
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // nothing but a hole from off to the end
		}
		if err != nil {
			return fmt.Errorf("find data after offset %d: %w", off, err)
		}
		if data >= size {
			return nil
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("find the hole after offset %d: %w", data, err)
		}
		end := min(hole, size)
		for pos := data; pos < end; {
			if err := ctx.Err(); err != nil {
				return err
			}
			chunk := buf[:min(int64(len(buf)), end-pos)]
			if _, err := src.ReadAt(chunk, pos); err != nil {
				return fmt.Errorf("read at offset %d: %w", pos, err)
			}
			if !bytes.Equal(chunk, zeroChunk[:len(chunk)]) {
				if _, err := dst.WriteAt(chunk, pos); err != nil {
					return spaceError(err, "write at offset %d", pos)
				}
			}
			pos += int64(len(chunk))
		}
		off = end
	}
	return nil
}

// sizeError classifies a failed truncate: a size the filesystem cannot
// represent is out of range, no space is exhaustion.
func sizeError(err error, size int64, format string, args ...any) error {
	if errors.Is(err, syscall.EFBIG) || errors.Is(err, syscall.EINVAL) {
		return errdefs.Wrap(errdefs.ErrOutOfRange, err, "the pool filesystem cannot hold a %d-byte image", size)
	}
	return spaceError(err, format, args...)
}

// fsName names the filesystem under dir, for messages that tell an operator
// why reflinks are not available.
func fsName(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "an unknown filesystem"
	}
	switch st.Type {
	case unix.XFS_SUPER_MAGIC:
		return "xfs (without reflink)"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.NFS_SUPER_MAGIC:
		return "nfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	}
	return fmt.Sprintf("a filesystem of type %#x", st.Type)
}
