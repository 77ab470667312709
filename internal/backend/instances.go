package backend

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// Instances are the backend instances one Spindle process serves, by key
// ("loop/default"). The controller side and the node side route every
// request through them: a volume ID by its instance key, StorageClass
// parameters by the instance that claims them, a pre-provisioned volume by
// the instance its attributes fit.
type Instances map[string]*Instance

// Keys lists the instance keys, sorted.
func (s Instances) Keys() []string { return slices.Sorted(maps.Keys(s)) }

// Serving returns the instance that serves id; an instance this process
// does not serve is ErrPrecondition, naming those it does.
func (s Instances) Serving(id volumeid.ID) (*Instance, error) {
	inst, ok := s[id.InstanceKey()]
	if !ok {
		return nil, errdefs.Precondition("backend instance %s of volume %s is not configured in this driver (configured: %v)", id.InstanceKey(), id, s.Keys())
	}
	return inst, nil
}

// NodeLocal reports whether any instance keeps its images on this node
// only, which is when the driver reports topology at all.
func (s Instances) NodeLocal() bool {
	for _, inst := range s {
		if inst.NodeLocal {
			return true
		}
	}
	return false
}

// Claiming is the key of the instance whose store claims parameters that
// name no backend, "" when none does; two that do is ambiguous.
func (s Instances) Claiming(params map[string]string) (string, error) {
	var claimed []string
	for _, key := range s.Keys() {
		if p, ok := s[key].Store.(Parameters); ok && p.Claims(params) {
			claimed = append(claimed, key)
		}
	}
	switch len(claimed) {
	case 0:
		return "", nil
	case 1:
		return claimed[0], nil
	}
	return "", errdefs.InvalidArgument("parameters fit backends %s: name one with parameters.%s", strings.Join(claimed, " and "), ParamBackend)
}

// Static finds the instance that serves the pre-provisioned volume handle
// with attributes attrs (StaticVolumes), and the image it names: the one
// the attribute ParamBackend names, else the one whose store claims the
// attributes. field is the request's field, for messages.
func (s Instances) Static(field, handle string, attrs map[string]string) (*Instance, StaticVolumes, string, error) {
	if err := refuseEncryptedImage(field, handle, attrs); err != nil {
		return nil, nil, "", err
	}
	var claimed []*Instance
	for _, key := range s.Keys() {
		inst := s[key]
		_, static := inst.Store.(StaticVolumes)
		p, ok := inst.Store.(Parameters)
		if static && ok && (attrs[ParamBackend] == key || attrs[ParamBackend] == "" && p.Claims(attrs)) {
			claimed = append(claimed, inst)
		}
	}
	switch len(claimed) {
	case 0:
		return nil, nil, "", errdefs.NotFound("%s %.64q is no Spindle volume ID, and no configured backend serves a pre-provisioned volume with its volume attributes (%s %q)", field, handle, "clusterID", attrs["clusterID"])
	case 1:
	default:
		return nil, nil, "", errdefs.InvalidArgument("%s %.64q: the pre-provisioned volume's attributes fit backends %s and %s; name one with the volume attribute %s", field, handle, claimed[0].Key(), claimed[1].Key(), ParamBackend)
	}
	sv := claimed[0].Store.(StaticVolumes)
	image, err := sv.StaticImage(handle, attrs)
	if err != nil {
		return nil, nil, "", errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_context")
	}
	if _, err := volumeid.New(claimed[0].Type, claimed[0].Name, image); err != nil {
		return nil, nil, "", errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_context")
	}
	return claimed[0], sv, image, nil
}

// refuseEncryptedImage refuses an image made outside Spindle whose
// attributes say it is encrypted (ceph-csi puts its StorageClass's
// encrypted and encryptionKMSID into a volume's attributes): Spindle opens
// only the encrypted volumes it created, whose wrapped key it keeps with
// the image; such an image has none of Spindle's, and staging it as plain
// would hand the pod a LUKS header.
func refuseEncryptedImage(field, handle string, attrs map[string]string) error {
	v, ok := attrs[ParamEncrypted]
	if !ok {
		return nil
	}
	if on, err := strconv.ParseBool(v); err == nil && !on {
		return nil
	}
	return errdefs.InvalidArgument("%s %.64q: its volume attributes say %s %q, but Spindle opens only the encrypted volumes it created (it keeps their wrapped key with the image); an image made or encrypted elsewhere (ceph-csi keeps the key in its own KMS) cannot be a pre-provisioned or adopted volume encrypted", field, handle, ParamEncrypted, v)
}

// IsStatic reports whether a volume context marks a pre-provisioned volume.
func IsStatic(attrs map[string]string) bool { return attrs[StaticVolumeAttribute] == "true" }
