package driver

import (
	"errors"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/node"
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
// NodeUnstage has it removed. The instance and the image a handle names
// are found by backend.Instances.Static; the controller side publishes
// them (controller.PublishStatic).

// nodeTarget is the volume a node request acts on.
type nodeTarget struct {
	id     string // the request's volume_id: a Spindle ID or a static handle
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
		inst, err := d.instances.Serving(id)
		if err != nil {
			return nodeTarget{}, err
		}
		return nodeTarget{id: id.String(), vol: volume(id, inst)}, nil
	}
	if errdefs.KindOf(perr) != errdefs.ErrNotFound {
		return nodeTarget{}, perr
	}
	var sv *node.StaticVolume
	if backend.IsStatic(attrs) {
		inst, _, image, err := d.instances.Static(field, raw, attrs)
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
		return nodeTarget{}, errdefs.Precondition("pre-provisioned volume %.64q is of backend %s, which is not configured in this driver (configured: %v)", raw, sv.Backend, d.instances.Keys())
	}
	st, ok := inst.Store.(backend.StaticVolumes)
	if !ok {
		return nodeTarget{}, errdefs.Precondition("backend %s serves no pre-provisioned volumes", sv.Backend)
	}
	return nodeTarget{id: raw, static: sv, vol: node.Volume{ID: raw, Image: sv.Image, Attacher: st.StaticAttacher()}}, nil
}

// lockNode takes the node lock of a resolved volume.
func (d *Driver) lockNode(t nodeTarget) (func(), error) {
	return d.locks.Acquire("node/"+t.id, "volume "+t.id)
}
