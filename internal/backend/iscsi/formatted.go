package iscsi

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/command"
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
	if err != nil {
		return err
	}
	if sig.blank() {
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

// signature is what blkid found in an image file.
type signature struct {
	Type   string // ext4, xfs, LVM2_member, ...
	Usage  string // filesystem, raid, crypto, other
	PTType string // a partition table: dos, gpt
	// Ambivalent: more than one signature (blkid exit status 8).
	Ambivalent bool
}

func (s signature) blank() bool { return s == signature{} }

// signatureProber tells what an image file holds.
type signatureProber interface {
	Probe(ctx context.Context, path string) (signature, error)
}

// blkid exit statuses (blkid(8)).
const (
	blkidNothingFound = 2
	blkidAmbivalent   = 8
)

// blkidProber asks "blkid -p" (low-level probing, no cache), as a node asks
// of a device before it formats one. Exit status 2 with nothing on stderr
// is the only answer that means blank; any other failure is an error.
type blkidProber struct{ run *command.Runner }

func (b blkidProber) Probe(ctx context.Context, path string) (signature, error) {
	out, err := b.run.Run(ctx, "blkid", "-p", "-o", "export", path)
	switch code := command.ExitCode(err); {
	case err == nil:
	case code == blkidNothingFound && command.Stderr(err) == "":
		return signature{}, nil
	case code == blkidAmbivalent:
		return signature{Ambivalent: true}, nil
	default:
		return signature{}, errdefs.Wrap(errdefs.ErrUnavailable, err, "cannot tell what the image file %s holds", path)
	}
	var sig signature
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		switch key {
		case "TYPE":
			sig.Type = value
		case "USAGE":
			sig.Usage = value
		case "PTTYPE":
			sig.PTType = value
		}
	}
	if sig.blank() {
		// blkid said it found something but named nothing: do not call that blank.
		return signature{}, fmt.Errorf("blkid reports a signature in %s it cannot name: %q", path, strings.TrimSpace(string(out)))
	}
	return sig, nil
}
