package driver

import (
	"maps"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/config"
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

// capability is a validated csi.VolumeCapability.
type capability struct {
	accessType backend.AccessType
	mode       backend.AccessMode
	fsType     string   // "" when the request leaves it to the driver
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
		cp.mode = backend.AccessMode(m.String())
	}
	switch t := c.GetAccessType().(type) {
	case *csi.VolumeCapability_Block:
		cp.accessType = backend.AccessBlock
	case *csi.VolumeCapability_Mount:
		cp.accessType = backend.AccessMount
		cp.fsType = t.Mount.GetFsType()
		if cp.fsType != "" {
			if _, err := blockdev.LookupFilesystem(cp.fsType); err != nil {
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
		if cp.mode == backend.MultiNodeMultiWriter || cp.mode == backend.MultiNodeSingleWriter {
			return capability{}, errdefs.InvalidArgument("%s: access mode %s needs a cluster filesystem; Spindle offers it only for volumeMode Block", field, cp.mode)
		}
	default:
		return capability{}, errdefs.InvalidArgument("%s.access_type must be mount or block", field)
	}
	return cp, nil
}

// parseCapabilities validates CreateVolume's list: at least one, and all of
// one access type and one fs type, since one image serves them all.
func parseCapabilities(field string, caps []*csi.VolumeCapability) ([]capability, error) {
	if len(caps) == 0 {
		return nil, errdefs.InvalidArgument("%s is required", field)
	}
	out := make([]capability, 0, len(caps))
	for i, c := range caps {
		cp, err := parseCapability(field+"["+strconv.Itoa(i)+"]", c)
		if err != nil {
			return nil, err
		}
		if i > 0 && cp.accessType != out[0].accessType {
			return nil, errdefs.InvalidArgument("%s mixes %s and %s access; a volume is one or the other", field, out[0].accessType, cp.accessType)
		}
		if i > 0 && cp.fsType != out[0].fsType {
			return nil, errdefs.InvalidArgument("%s asks for fs types %q and %q; a volume holds one filesystem", field, out[0].fsType, cp.fsType)
		}
		out = append(out, cp)
	}
	return out, nil
}

// StorageClass parameters Spindle understands itself, whatever the
// backend; a backend takes more of its own (backend.Parameters: the rbd
// backend takes ceph-csi's).
const (
	paramBackend     = backend.ParamBackend     // "<type>/<instance>"; the default instance when absent
	paramMkfsOptions = backend.ParamMkfsOptions // extra mkfs arguments, whitespace-separated
	// Keys with this prefix are added or read by the sidecars
	// (--extra-create-metadata: PVC name, namespace, PV name; the
	// secrets' names); they never change what is created, but for fstype.
	provisionerPrefix = backend.ProvisionerPrefix
	// paramFsType is the external-provisioner's: it takes it from the
	// StorageClass into the volume capability, so it reaches CreateVolume
	// only from a caller that is not the sidecar; it then means the same.
	paramFsType = provisionerPrefix + "fstype"
)

// volumeParameters is the validated parameter map of a CreateVolume.
type volumeParameters struct {
	instance    string            // backend instance key
	mkfsOptions []string          // parsed mkfsOptions
	fsType      string            // csi.storage.k8s.io/fstype, "" when absent
	shaping     map[string]string // the parameters that shape the volume, kept in its metadata
	encrypted   bool              // encrypted: "true"
	kmsID       string            // the KMS that wraps its passphrase (encryption.go)
}

// parseParameters validates a CreateVolume's parameters and picks its
// backend instance: the one "backend" names, else the one whose store
// claims the parameters (a ceph-csi clusterID it serves), else the
// default. Keys the driver does not take go to the instance's store
// (backend.Parameters), which refuses those it does not take either, and
// are kept with the volume.
func (d *Driver) parseParameters(params map[string]string) (volumeParameters, error) {
	vp := volumeParameters{instance: d.defaultInstance, shaping: map[string]string{}}
	backendKeys := map[string]string{}
	for k, v := range params {
		switch {
		case k == paramBackend:
			if _, ok := d.instances[v]; !ok {
				return volumeParameters{}, errdefs.InvalidArgument("parameters.backend %q is not a configured backend instance (configured: %v)", v, d.instanceKeys())
			}
			vp.instance = v
		case k == paramMkfsOptions:
			opts, err := parseMkfsOptions(v)
			if err != nil {
				return volumeParameters{}, err
			}
			if len(opts) > 0 {
				vp.mkfsOptions = opts
				vp.shaping[k] = strings.Join(opts, " ")
			}
		case k == paramFsType:
			if v != "" {
				if _, err := blockdev.LookupFilesystem(v); err != nil {
					return volumeParameters{}, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "parameters.%s", k)
				}
			}
			vp.fsType = v
		case k == paramEncrypted, k == paramEncryptionKMSID:
			// The driver's (encryption.go), whatever the backend: never
			// the store's.
		case isProvisionerKey(k):
		default:
			backendKeys[k] = v
		}
	}
	if err := d.encryptionParameters(&vp, params); err != nil {
		return volumeParameters{}, err
	}
	if _, named := params[paramBackend]; !named {
		inst, err := d.claimingInstance(params)
		if err != nil {
			return volumeParameters{}, err
		}
		if inst != "" {
			vp.instance = inst
		}
	}
	if len(backendKeys) == 0 {
		return vp, nil
	}
	p, ok := d.instances[vp.instance].Store.(backend.Parameters)
	if !ok {
		for k := range backendKeys {
			return volumeParameters{}, errdefs.InvalidArgument("parameters: unknown key %q (known: %s, %s, %s, %s; backend %s takes no parameters of its own)", k, paramBackend, paramMkfsOptions, paramEncrypted, paramEncryptionKMSID, vp.instance)
		}
	}
	if err := p.CheckVolumeParameters(backendKeys); err != nil {
		return volumeParameters{}, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "backend %s", vp.instance)
	}
	maps.Copy(vp.shaping, backendKeys)
	return vp, nil
}

// claimingInstance is the instance whose store claims parameters that
// name no backend, "" when none does; two that do is ambiguous.
func (d *Driver) claimingInstance(params map[string]string) (string, error) {
	var claimed []string
	for _, key := range d.instanceKeys() {
		if p, ok := d.instances[key].Store.(backend.Parameters); ok && p.Claims(params) {
			claimed = append(claimed, key)
		}
	}
	switch len(claimed) {
	case 0:
		return "", nil
	case 1:
		return claimed[0], nil
	}
	return "", errdefs.InvalidArgument("parameters fit backends %s: name one with parameters.%s", strings.Join(claimed, " and "), paramBackend)
}

// snapshotParameters validates a CreateSnapshot's parameters for a source
// volume of inst and returns those its store takes. The sidecar's keys are
// left out; a backend that takes no parameters refuses any other.
func snapshotParameters(inst *backend.Instance, sourceImage string, params map[string]string) (map[string]string, error) {
	own := map[string]string{}
	for k, v := range params {
		if !isProvisionerKey(k) {
			own[k] = v
		}
	}
	if len(own) == 0 {
		return nil, nil
	}
	p, ok := inst.Store.(backend.Parameters)
	if !ok {
		for k := range own {
			return nil, errdefs.InvalidArgument("parameters: unknown key %q (backend %s takes no snapshot parameters)", k, inst.Key())
		}
	}
	if err := p.CheckSnapshotParameters(sourceImage, own); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "backend %s", inst.Key())
	}
	return own, nil
}

// maxMkfsOptions bounds mkfsOptions: they become mkfs's command line.
const maxMkfsOptions = 1024

// parseMkfsOptions splits mkfsOptions on whitespace (no shell quoting) and
// keeps the device argument Spindle's own: a bare path would name a second
// device for mkfs.
func parseMkfsOptions(s string) ([]string, error) {
	if len(s) > maxMkfsOptions {
		return nil, errdefs.InvalidArgument("parameters.mkfsOptions is %d bytes long; the maximum is %d", len(s), maxMkfsOptions)
	}
	fields := strings.Fields(s)
	for _, f := range fields {
		if strings.IndexFunc(f, unicode.IsControl) >= 0 {
			return nil, errdefs.InvalidArgument("parameters.mkfsOptions contains a control character")
		}
		if strings.HasPrefix(f, "/") {
			return nil, errdefs.InvalidArgument("parameters.mkfsOptions: %q looks like a device path; only options are allowed", f)
		}
	}
	return fields, nil
}

// mkfsOptionsFromContext reads the mkfsOptions CreateVolume put in the
// volume context (the image's shaping parameters, see csiVolume).
func mkfsOptionsFromContext(vc map[string]string) ([]string, error) {
	return parseMkfsOptions(vc[paramMkfsOptions])
}

// Capacity rules.
const (
	mib = int64(1) << 20
	gib = int64(1) << 30
	// defaultCapacity is used when the request names no size.
	defaultCapacity = 1 * gib
	// capacityUnit: sizes are rounded up to whole MiB, which every
	// filesystem's block size and every device's sector size divides.
	capacityUnit = mib
	// maxCapacity keeps sizes far from int64 overflow and from what a
	// single sparse file or loop device should be asked to hold.
	maxCapacity = 64 << 40
)

// resolveCapacity picks the size to allocate for a capacity range: the
// required size (or the default, capped by the limit and then rounded down
// to a MiB so that it stays within it), at least minBytes, rounded up to a
// MiB; OUT_OF_RANGE when that exceeds the limit.
func resolveCapacity(cr *csi.CapacityRange, minBytes int64) (int64, error) {
	required, limit := cr.GetRequiredBytes(), cr.GetLimitBytes()
	if required < 0 || limit < 0 {
		return 0, errdefs.InvalidArgument("capacity_range must not be negative (required_bytes %d, limit_bytes %d)", required, limit)
	}
	if limit > 0 && required > limit {
		return 0, errdefs.InvalidArgument("capacity_range.required_bytes %d exceeds limit_bytes %d", required, limit)
	}
	size := required
	if size == 0 {
		size = defaultCapacity
		if limit > 0 && limit < size {
			// The largest whole-MiB size within the limit; a limit below
			// one MiB leaves none, and the check below says so.
			size = limit
			if whole := limit / capacityUnit * capacityUnit; whole > 0 {
				size = whole
			}
		}
	}
	if size < minBytes {
		size = minBytes
	}
	if size > maxCapacity {
		return 0, errdefs.OutOfRange("%d bytes is more than the largest volume Spindle creates (%d bytes)", size, int64(maxCapacity))
	}
	size = (size + capacityUnit - 1) / capacityUnit * capacityUnit
	if limit > 0 && size > limit {
		return 0, errdefs.OutOfRange("no size within capacity_range [%d, %d] bytes is possible: volumes are whole MiB, and at least %d bytes for this filesystem", required, limit, minBytes)
	}
	return size, nil
}

// isProvisionerKey reports whether a parameter key was added by a sidecar
// (--extra-create-metadata), not by the user: informational, never shaping.
func isProvisionerKey(k string) bool { return strings.HasPrefix(k, provisionerPrefix) }
