package driver

import (
	"path/filepath"
	"strconv"
	"strings"
	"unicode"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/config"
	"github.com/spindle-csi/spindle/internal/controller"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// Every validation error names the request field it is about, in the
// spelling of the CSI spec, so the message in a VolumeAttachment or an
// event points at what to fix.

// requireVolumeID refuses a missing volume ID. RPCs check it first and the
// other required fields next, and look the volume up (lookupVolumeID) only
// then: a request that lacks a field is malformed whatever its ID names.
func requireVolumeID(field, s string) error {
	if s == "" {
		return errdefs.InvalidArgument("%s is required", field)
	}
	return nil
}

// lookupVolumeID parses the ID of a volume an RPC looks up. An ID that
// Spindle could never have issued (another driver's, a test tool's, a typo,
// a path traversal or control characters) names no volume: NOT_FOUND, as
// the spec has it for a volume that does not exist. Such an ID goes no
// further: no part of it is ever used as a path, a key or an argument.
func lookupVolumeID(field, s string) (volumeid.ID, error) {
	if err := requireVolumeID(field, s); err != nil {
		return volumeid.ID{}, err
	}
	id, err := volumeid.Parse(s)
	if err != nil {
		return volumeid.ID{}, errdefs.Wrap(errdefs.ErrNotFound, err, "%s %.64q names no Spindle volume", field, s)
	}
	return id, nil
}

func validateNodeID(field, s string) error {
	if s == "" {
		return errdefs.InvalidArgument("%s is required", field)
	}
	if err := config.ValidateNodeID(s); err != nil {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, err, "%s", field)
	}
	return nil
}

// maxPathLength is PATH_MAX.
const maxPathLength = 4096

// validatePath checks a staging or target path: required, absolute, clean.
func validatePath(field, p string) error {
	switch {
	case p == "":
		return errdefs.InvalidArgument("%s is required", field)
	case len(p) > maxPathLength:
		return errdefs.InvalidArgument("%s is longer than %d bytes", field, maxPathLength)
	case strings.ContainsRune(p, 0):
		return errdefs.InvalidArgument("%s contains a NUL byte", field)
	case strings.IndexFunc(p, unicode.IsControl) >= 0:
		// Kubelet never makes such a path, and mount(8) and the mount
		// table cannot carry it faithfully.
		return errdefs.InvalidArgument("%s %q contains a control character", field, p)
	case !filepath.IsAbs(p):
		return errdefs.InvalidArgument("%s %q must be an absolute path", field, p)
	case filepath.Clean(p) != p && filepath.Clean(p) != strings.TrimSuffix(p, "/"):
		return errdefs.InvalidArgument("%s %q must be a clean path (no '.', '..' or repeated '/')", field, p)
	}
	for _, name := range strings.Split(p, "/") {
		if len(name) > maxNameComponent {
			return errdefs.InvalidArgument("%s has a name of %d bytes; the most a filesystem allows is %d", field, len(name), maxNameComponent)
		}
	}
	return nil
}

// maxNameComponent is NAME_MAX, the longest name one directory entry can have.
const maxNameComponent = 255

// maxNameLength is the longest CSI name accepted in CreateVolume.
const maxNameLength = 128

func validateName(field, name string) error {
	if name == "" {
		return errdefs.InvalidArgument("%s is required", field)
	}
	if len(name) > maxNameLength {
		return errdefs.InvalidArgument("%s is %d bytes long; the maximum is %d", field, len(name), maxNameLength)
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return errdefs.InvalidArgument("%s %q contains a control character", field, name)
		}
	}
	return nil
}

// capability is a validated csi.VolumeCapability: what the controller side
// needs of it, and the mount flags the node side mounts with.
type capability struct {
	controller.Capability
	mountFlags []string // mount only
}

// refusedMountFlags would change what a mount means rather than how it behaves.
var refusedMountFlags = map[string]bool{"bind": true, "rbind": true, "remount": true, "move": true, "make-shared": true}

func parseCapability(field string, c *csi.VolumeCapability) (capability, error) {
	if c == nil {
		return capability{}, errdefs.InvalidArgument("%s is required", field)
	}
	var cp capability
	switch m := c.GetAccessMode().GetMode(); m {
	case csi.VolumeCapability_AccessMode_UNKNOWN:
		return capability{}, errdefs.InvalidArgument("%s.access_mode is required", field)
	default:
		if _, ok := csi.VolumeCapability_AccessMode_Mode_name[int32(m)]; !ok {
			return capability{}, errdefs.InvalidArgument("%s.access_mode %d is not a CSI access mode", field, m)
		}
		cp.Mode = backend.AccessMode(m.String())
	}
	switch t := c.GetAccessType().(type) {
	case *csi.VolumeCapability_Block:
		cp.Access = backend.AccessBlock
	case *csi.VolumeCapability_Mount:
		cp.Access = backend.AccessMount
		cp.FsType = t.Mount.GetFsType()
		if cp.FsType != "" {
			if _, err := blockdev.LookupFilesystem(cp.FsType); err != nil {
				return capability{}, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "%s.mount.fs_type", field)
			}
		}
		for _, f := range t.Mount.GetMountFlags() {
			if f == "" || strings.IndexFunc(f, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
				return capability{}, errdefs.InvalidArgument("%s.mount.mount_flags: %q is not a mount option", field, f)
			}
			if refusedMountFlags[f] {
				return capability{}, errdefs.InvalidArgument("%s.mount.mount_flags: %q is not allowed", field, f)
			}
		}
		cp.mountFlags = t.Mount.GetMountFlags()
		// A filesystem that two nodes write at once is corrupted: none of
		// ext4, xfs, btrfs is a cluster filesystem.
		if cp.Mode == backend.MultiNodeMultiWriter || cp.Mode == backend.MultiNodeSingleWriter {
			return capability{}, errdefs.InvalidArgument("%s: access mode %s needs a cluster filesystem; Spindle offers it only for volumeMode Block", field, cp.Mode)
		}
	default:
		return capability{}, errdefs.InvalidArgument("%s.access_type must be mount or block", field)
	}
	return cp, nil
}

// parseCapabilities validates CreateVolume's list: at least one, and all of
// one access type and one fs type, since one image serves them all.
func parseCapabilities(field string, caps []*csi.VolumeCapability) ([]controller.Capability, error) {
	if len(caps) == 0 {
		return nil, errdefs.InvalidArgument("%s is required", field)
	}
	out := make([]controller.Capability, 0, len(caps))
	for i, c := range caps {
		cp, err := parseCapability(field+"["+strconv.Itoa(i)+"]", c)
		if err != nil {
			return nil, err
		}
		if i > 0 && cp.Access != out[0].Access {
			return nil, errdefs.InvalidArgument("%s mixes %s and %s access; a volume is one or the other", field, out[0].Access, cp.Access)
		}
		if i > 0 && cp.FsType != out[0].FsType {
			return nil, errdefs.InvalidArgument("%s asks for fs types %q and %q; a volume holds one filesystem", field, out[0].FsType, cp.FsType)
		}
		out = append(out, cp.Capability)
	}
	return out, nil
}

// mkfsOptionsFromContext reads the mkfsOptions CreateVolume put in the
// volume context (the image's shaping parameters).
func mkfsOptionsFromContext(vc map[string]string) ([]string, error) {
	return controller.ParseMkfsOptions(vc[backend.ParamMkfsOptions])
}
