package blockdev

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Signature is what blkid found on a device (or an image file).
type Signature struct {
	Type   string // filesystem or other signature type: ext4, xfs, LVM2_member, swap, ...
	Usage  string // filesystem, raid, crypto, other
	PTType string // partition table type: dos, gpt
}

// Blank reports whether nothing was found.
func (s Signature) Blank() bool { return s.Type == "" && s.PTType == "" }

func (s Signature) String() string {
	switch {
	case s.PTType != "":
		return "a " + s.PTType + " partition table"
	case s.Usage == "filesystem":
		return article(s.Type) + " " + s.Type + " filesystem"
	case s.Type != "":
		return "a " + s.Type + " signature"
	}
	return "no signature"
}

// article is "an" before a vowel sound as the names are read (an ext4, an
// xfs), "a" otherwise (a btrfs).
func article(word string) string {
	if word != "" && strings.ContainsRune("aeiouAEIOUx", rune(word[0])) {
		return "an"
	}
	return "a"
}

// blkid exit statuses (blkid(8)).
const (
	blkidNothingFound = 2
	blkidAmbivalent   = 8
)

// Blkid tells what a device or an image file holds with "blkid -p". The
// node asks it of a device before it formats one; the iSCSI controller asks
// it of an image file to learn that a node formatted the volume.
type Blkid struct{ run *command.Runner }

// NewBlkid returns a Blkid that runs blkid through run.
func NewBlkid(run *command.Runner) Blkid { return Blkid{run: run} }

// Probe asks "blkid -p" (low-level probing, no cache) what path holds. Exit
// status 2 with nothing on stderr is the only answer that means blank; every
// other failure is an error, never a reason to format.
func (b Blkid) Probe(ctx context.Context, path string) (Signature, error) {
	out, err := b.run.Run(ctx, "blkid", "-p", "-o", "export", path)
	switch code := command.ExitCode(err); {
	case err == nil:
	case code == blkidNothingFound && command.Stderr(err) == "":
		return Signature{}, nil
	case code == blkidNothingFound:
		// blkid also exits 2 when it cannot open the device ("blkid:
		// error: /dev/x: Permission denied"); an exit 2 with a complaint
		// is not proof that the device was read and holds nothing.
		return Signature{}, fmt.Errorf("cannot tell what %s holds: %w", path, err)
	case code == blkidAmbivalent:
		return Signature{}, errdefs.Wrap(errdefs.ErrPrecondition, err, "%s holds more than one signature; refusing to guess which one is the data", path)
	default:
		return Signature{}, fmt.Errorf("cannot tell what %s holds: %w", path, err)
	}
	var sig Signature
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
	if sig.Blank() {
		// blkid said it found something but named nothing: do not call that blank.
		return Signature{}, errdefs.Precondition("blkid reports a signature on %s it cannot name: %q", path, strings.TrimSpace(string(out)))
	}
	return sig, nil
}
