package iscsi

import (
	"context"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Where the "formatted" fact of an iSCSI volume lives.
//
// A node reads and writes no pool, so it cannot record that it formatted a
// volume, and the pool's record cannot reach it. The fact lives where the
// node's mkfs puts it, in the filesystem on the device: the node formats
// only a device that "blkid -p" reports blank (exit status 2), so a device
// it formatted once, or one mkfs ran on before a crash, is never formatted
// again. The controller, which owns the pool, copies the fact into the
// image's record the next time it publishes the volume: it probes the image
// file with blkid while the record still says unformatted. Each publish
// hands the node the record (ContextFormatted): true for a volume the
// controller has seen holding anything, and for every copy (a restore or a
// clone, which holds its source's data, whatever its record says). With
// true the node never formats, even a device that blkid reports blank: a
// filesystem whose superblock was damaged is refused rather than formatted
// over.

// Keys of the publish_context besides the target's (iscsi.go).
const (
	// ContextInitiator is the initiator name the target's ACL admits for
	// the node the volume was published to.
	ContextInitiator = "initiator"
	// ContextFormatted is "true" when the node must never format the
	// volume, "false" when it may format a blank device; a publish_context
	// without it (from an older controller) counts as "true".
	ContextFormatted = "formatted"
	// ContextFsType is the filesystem the volume holds or is to hold.
	ContextFsType = "fsType"
	// ContextAccessType is "mount" or "block", what the volume was made for.
	ContextAccessType = "accessType"
)

// neverFormat says whether a node must never format the image: it holds a
// filesystem (or anything) as far as the store knows, or it is a copy.
func neverFormat(img *backend.Image) bool { return img.Formatted || img.Source != nil }

// learnFormatted records in the image's metadata what its file holds, while
// the record says it holds nothing yet: a node formats a volume without
// telling the store (it has no pool), and the next publish hands the node
// the record. Only mount volumes are formatted, so only they are probed.
func (s *Store) learnFormatted(ctx context.Context, imageID string) error {
	fs, err := s.pool.open()
	if err != nil {
		return err
	}
	img, err := fs.Get(ctx, imageID)
	if err != nil || img.Formatted || img.AccessType != backend.AccessMount {
		return err
	}
	// blkid reports a file that is not there as blank, silently.
	if err := fs.CheckImage(ctx, imageID); err != nil {
		return err
	}
	sig, err := s.probe.Probe(ctx, fs.ImagePath(imageID))
	if err != nil && errdefs.KindOf(err) == nil {
		// blkid could not read the file: try again later.
		err = errdefs.Wrap(errdefs.ErrUnavailable, err, "volume %s", imageID)
	}
	if err != nil {
		return err
	}
	if sig.Blank() {
		return nil
	}
	_, err = fs.Update(ctx, imageID, func(img *backend.Image) error {
		if img.Formatted {
			return backend.ErrUnchanged
		}
		img.Formatted = true
		if sig.Usage == "filesystem" && sig.Type != "" {
			img.FsType = sig.Type
		}
		return nil
	})
	return err
}

// signatureProber tells what an image file holds: "blkid -p", as a node
// asks of a device before it formats one (blockdev.Blkid). Blank
// only for exit status 2 with nothing on stderr; any other failure, more
// than one signature included, is an error.
type signatureProber interface {
	Probe(ctx context.Context, path string) (blockdev.Signature, error)
}
