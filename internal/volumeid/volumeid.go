// Package volumeid parses and builds Spindle's self-describing volume IDs:
// "<backend>/<instance>/<image>", where the image part may itself hold
// slashes (an RBD image is "pool/image"). Every RPC routes on the ID alone,
// so the ID is validated strictly before any part of it is used as a path,
// a command argument or a map key.
package volumeid

import (
	"regexp"
	"strings"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// MaxLength is the longest ID accepted. CSI allows 128 bytes as the
// recommended maximum for IDs that a CO stores.
const MaxLength = 128

var (
	backendRe  = regexp.MustCompile(`^[a-z][a-z0-9]{0,15}$`)
	instanceRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)
	segmentRe  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]*$`)
)

// ID is a parsed volume (or snapshot) ID.
type ID struct {
	Backend  string // "loop", "iscsi", "rbd"
	Instance string // the backend instance from the config, e.g. "default"
	Image    string // the backend's own name for the image; may contain '/'
}

// String renders the ID in its wire form.
func (id ID) String() string { return id.Backend + "/" + id.Instance + "/" + id.Image }

// InstanceKey names the backend instance: "<backend>/<instance>".
func (id ID) InstanceKey() string { return id.Backend + "/" + id.Instance }

// Parse validates s and splits it. The error is of kind InvalidArgument and
// says what is wrong with the ID.
func Parse(s string) (ID, error) {
	if s == "" {
		return ID{}, errdefs.InvalidArgument("volume ID is empty")
	}
	if len(s) > MaxLength {
		return ID{}, errdefs.InvalidArgument("volume ID %.40q... is %d bytes long; the maximum is %d", s, len(s), MaxLength)
	}
	parts := strings.SplitN(s, "/", 3)
	if len(parts) != 3 {
		return ID{}, errdefs.InvalidArgument("volume ID %q is not of the form <backend>/<instance>/<image>", s)
	}
	id := ID{Backend: parts[0], Instance: parts[1], Image: parts[2]}
	if err := id.validate(); err != nil {
		return ID{}, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume ID %q", s)
	}
	return id, nil
}

// New builds an ID from its parts and validates it.
func New(backend, instance, image string) (ID, error) {
	id := ID{Backend: backend, Instance: instance, Image: image}
	if err := id.validate(); err != nil {
		return ID{}, err
	}
	if n := len(id.String()); n > MaxLength {
		return ID{}, errdefs.InvalidArgument("volume ID %q is %d bytes long; the maximum is %d", id.String(), n, MaxLength)
	}
	return id, nil
}

func (id ID) validate() error {
	if !backendRe.MatchString(id.Backend) {
		return errdefs.InvalidArgument("backend %q is not a backend name (lower-case letters and digits)", id.Backend)
	}
	if err := ValidateInstanceName(id.Instance); err != nil {
		return err
	}
	if id.Image == "" {
		return errdefs.InvalidArgument("image name is empty")
	}
	if strings.Contains(id.Image, "..") {
		return errdefs.InvalidArgument("image name %q contains \"..\"", id.Image)
	}
	for _, seg := range strings.Split(id.Image, "/") {
		if seg == "" {
			return errdefs.InvalidArgument("image name %q has an empty segment", id.Image)
		}
		if !segmentRe.MatchString(seg) {
			return errdefs.InvalidArgument("image name segment %q has characters outside [A-Za-z0-9._-] or starts with '.' or '-'", seg)
		}
	}
	return nil
}

// ValidateInstanceName checks a backend instance name as used in IDs and in the config.
func ValidateInstanceName(name string) error {
	if !instanceRe.MatchString(name) {
		return errdefs.InvalidArgument("instance %q is not a valid instance name (lower-case letters, digits and '-', at most 32)", name)
	}
	return nil
}
