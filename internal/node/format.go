package node

import (
	"context"
	"fmt"
	"time"

	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// mkfsTimeout bounds mkfs, which on a large device takes longer than most commands.
const mkfsTimeout = 10 * time.Minute

// Probe implements Host with "blkid -p" (blockdev.Blkid).
func (h *LinuxHost) Probe(ctx context.Context, dev string) (blockdev.Signature, error) {
	return blockdev.NewBlkid(h.run).Probe(ctx, dev)
}

// FormatRequest describes a device that should hold a filesystem.
type FormatRequest struct {
	Device      string
	Filesystem  blockdev.Filesystem
	MkfsOptions []string // from the StorageClass
	// AlreadyFormatted is the image store's "formatted" flag: such a device is
	// never formatted again, even if blkid finds nothing on it.
	AlreadyFormatted bool
	// ReadOnly devices cannot be formatted.
	ReadOnly bool
}

// ensureFilesystem makes sure req.Device holds req.Filesystem, creating it
// only when the device is blank and was never formatted. It reports whether
// it ran mkfs. A device holding anything else is refused, untouched.
func ensureFilesystem(ctx context.Context, h Host, req FormatRequest) (formatted bool, err error) {
	fs := req.Filesystem
	sig, err := h.Probe(ctx, req.Device)
	if err != nil {
		return false, err
	}
	if !sig.Blank() {
		if sig.Usage == "filesystem" && sig.Type == fs.Name {
			return false, nil
		}
		return false, errdefs.Precondition("%s holds %s, not %s; refusing to format or mount it as %s (its data is untouched)",
			req.Device, sig, fs.Name, fs.Name)
	}
	if req.AlreadyFormatted {
		return false, errdefs.Precondition("the volume was formatted before, but blkid finds no filesystem on %s; refusing to format it again (check the image for damage)", req.Device)
	}
	if req.ReadOnly {
		return false, errdefs.Precondition("%s holds no filesystem and is attached read-only, so it cannot be formatted; publish it writable once first", req.Device)
	}
	// blkid also exits 2, silently, for a path that is no device at all or
	// a device it could not read (a detached, zero-sized loop device); only
	// a block device with a size was really probed and found blank.
	if size, err := h.DeviceSize(req.Device); err != nil {
		return false, errdefs.Wrap(errdefs.ErrPrecondition, err, "refusing to format %s: it is not a usable block device", req.Device)
	} else if size == 0 {
		return false, errdefs.Precondition("refusing to format %s: the device has no size (is it still attached?)", req.Device)
	}
	if err := h.Mkfs(ctx, fs, req.MkfsOptions, req.Device); err != nil {
		return false, err
	}
	return true, nil
}

// stageFilesystem brings a device to its staged state: the filesystem made
// if (and only if) the device is blank and was never formatted, grown if
// its device grew while it was not staged, then mounted at target.
// recordFormatted runs between mkfs and mount whenever the image store does
// not yet know the device holds the filesystem, so a crash after mkfs never
// leaves a filesystem the store calls blank. The commands run in exactly
// this order: blkid, [mkfs], [ext4: size check, e2fsck, resize2fs], mount,
// [xfs, btrfs: size check, grow]. A filesystem just made fills its device,
// and one staged read-only cannot be grown, so neither is checked.
func stageFilesystem(ctx context.Context, h Host, req FormatRequest, target string, mountOptions []string, recordFormatted func(context.Context) error) (formatted bool, err error) {
	formatted, err = ensureFilesystem(ctx, h, req)
	if err != nil {
		return false, err
	}
	if formatted || !req.AlreadyFormatted {
		if err := recordFormatted(ctx); err != nil {
			return formatted, fmt.Errorf("record that %s holds %s: %w", req.Device, req.Filesystem.Name, err)
		}
	}
	checkGrowth := !formatted && !req.ReadOnly
	growsOffline := req.Filesystem.Name == "ext4"
	if checkGrowth && growsOffline {
		if err := growIfNeeded(ctx, h, req.Device, req.Filesystem.Name, ""); err != nil {
			return formatted, err
		}
	}
	if err := h.MountDevice(ctx, req.Device, target, req.Filesystem.Name, mountOptions); err != nil {
		return formatted, err
	}
	if checkGrowth && !growsOffline {
		if err := growIfNeeded(ctx, h, req.Device, req.Filesystem.Name, target); err != nil {
			// Leave nothing half-done: the caller's rollback unmounts.
			return formatted, err
		}
	}
	return formatted, nil
}

// growIfNeeded grows the filesystem on dev when its device grew while the
// volume was not staged (a ControllerExpandVolume of an unused volume).
func growIfNeeded(ctx context.Context, h Host, dev, fsType, mountPath string) error {
	grow, err := needsGrow(ctx, h, dev, fsType)
	if err != nil || !grow {
		return err
	}
	if err := h.GrowFilesystem(ctx, dev, fsType, mountPath); err != nil {
		return fmt.Errorf("grow the %s filesystem on %s to its device's size: %w", fsType, dev, err)
	}
	return nil
}
