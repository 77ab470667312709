package driver

import (
	"errors"
	"strconv"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/node"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// Pre-provisioned volumes. A PersistentVolume may name an image made
// outside Spindle in ceph-csi's static form: its volumeHandle is not a
// Spindle volume ID but the image's name, and its volumeAttributes (the
// volume context) say where the image is and mark it staticVolume "true".
// The backend that claims the attributes (backend.StaticVolumes; rbd by
// their clusterID) turns them into an image ID. ControllerPublish hands
// the node where the image is and records nothing; DeleteVolume of such a
// handle deletes nothing (it names no Spindle volume). On the node,
// NodeStage and NodePublish carry the volume context, but NodeUnstage,
// NodeUnpublish, the stats, the health check and NodeExpandVolume carry
// only the handle: NodeStage has the node side keep the handle's image in a
// small record (node.StaticVolume), kept across restarts of the plugin, and
// NodeUnstage has it removed.

// staticInstance finds the instance that serves the pre-provisioned
// volume handle with attributes attrs, and the image it names. field is
// the request's field for messages.
func (d *Driver) staticInstance(field, handle string, attrs map[string]string) (*backend.Instance, backend.StaticVolumes, string, error) {
	if err := refuseEncryptedImage(field, handle, attrs); err != nil {
		return nil, nil, "", err
	}
	var claimed []*backend.Instance
	for _, key := range d.instanceKeys() {
		inst := d.instances[key]
		_, static := inst.Store.(backend.StaticVolumes)
		p, ok := inst.Store.(backend.Parameters)
		if static && ok && (attrs[backend.ParamBackend] == key || attrs[backend.ParamBackend] == "" && p.Claims(attrs)) {
			claimed = append(claimed, inst)
		}
	}
	switch len(claimed) {
	case 0:
		return nil, nil, "", errdefs.NotFound("%s %.64q is no Spindle volume ID, and no configured backend serves a pre-provisioned volume with its volume attributes (%s %q)", field, handle, "clusterID", attrs["clusterID"])
	case 1:
	default:
		return nil, nil, "", errdefs.InvalidArgument("%s %.64q: the pre-provisioned volume's attributes fit backends %s and %s; name one with the volume attribute %s", field, handle, claimed[0].Key(), claimed[1].Key(), backend.ParamBackend)
	}
	sv := claimed[0].Store.(backend.StaticVolumes)
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
	v, ok := attrs[paramEncrypted]
	if !ok {
		return nil
	}
	if on, err := strconv.ParseBool(v); err == nil && !on {
		return nil
	}
	return errdefs.InvalidArgument("%s %.64q: its volume attributes say %s %q, but Spindle opens only the encrypted volumes it created (it keeps their wrapped key with the image); an image made or encrypted elsewhere (ceph-csi keeps the key in its own KMS) cannot be a pre-provisioned or adopted volume encrypted", field, handle, paramEncrypted, v)
}

// isStatic reports whether a volume context marks a pre-provisioned volume.
func isStatic(attrs map[string]string) bool { return attrs[backend.StaticVolumeAttribute] == "true" }

// nodeTarget is the volume a node request acts on.
type nodeTarget struct {
	id     string // the request's volume_id: a Spindle ID or a static handle
	inst   *backend.Instance
	vol    node.Volume
	static *node.StaticVolume
}

// resolveNodeVolume resolves a node request's volume_id. A Spindle volume
// ID is parsed; anything else is a pre-provisioned volume's handle,
// resolved from attrs when the request carries a volume context marking
// it static (NodeStage, NodePublish), else from this node's record of it.
// A handle that is neither names no volume: NOT_FOUND, as before.
func (d *Driver) resolveNodeVolume(field, raw string, attrs map[string]string) (nodeTarget, error) {
	id, perr := lookupVolumeID(field, raw)
	if perr == nil {
		inst, err := d.instanceFor(id)
		if err != nil {
			return nodeTarget{}, err
		}
		return nodeTarget{id: id.String(), inst: inst, vol: d.volume(id, inst)}, nil
	}
	if errdefs.KindOf(perr) != errdefs.ErrNotFound {
		return nodeTarget{}, perr
	}
	var sv *node.StaticVolume
	if isStatic(attrs) {
		inst, _, image, err := d.staticInstance(field, raw, attrs)
		if err != nil {
			return nodeTarget{}, err
		}
		sv = &node.StaticVolume{Handle: raw, Backend: inst.Key(), Image: image}
	} else {
		rec, err := d.node.StaticVolume(raw)
		if err != nil || rec == nil {
			return nodeTarget{}, errors.Join(perr, err)
		}
		sv = rec
	}
	inst, ok := d.instances[sv.Backend]
	if !ok {
		return nodeTarget{}, errdefs.Precondition("pre-provisioned volume %.64q is of backend %s, which is not configured in this driver (configured: %v)", raw, sv.Backend, d.instanceKeys())
	}
	st, ok := inst.Store.(backend.StaticVolumes)
	if !ok {
		return nodeTarget{}, errdefs.Precondition("backend %s serves no pre-provisioned volumes", sv.Backend)
	}
	return nodeTarget{id: raw, inst: inst, static: sv, vol: node.Volume{ID: raw, Image: sv.Image, Attacher: st.StaticAttacher()}}, nil
}

// lockNode takes the node lock of a resolved volume.
func (d *Driver) lockNode(t nodeTarget) (func(), error) {
	return d.locks.acquire("node/"+t.id, "volume "+t.id)
}
