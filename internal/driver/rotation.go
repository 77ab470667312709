package driver

import (
	"context"
	"net/http"
	"time"

	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/opsapi"
)

// The key-rotation endpoints (controller.PlanKeyRotation says the three
// steps): steps 1 and 3 are the controller side's, step 2 the node side's
// (node.Volumes.RotateKey), each served by the process of that mode.

// rotationTimeout bounds one step of a key rotation: two unwraps by the KMS
// and five cryptsetup calls on the node, each with its own deadline, took
// more than opsTimeout's 10 s in an emulated guest.
const rotationTimeout = 2 * time.Minute

// planKeyRotation is step 1.
func (d *Driver) planKeyRotation(ctx context.Context, r opsapi.RotateKeyRequest) (*opsapi.KeyRotation, error) {
	id, err := lookupVolumeID("volumeID", r.VolumeID)
	if err != nil {
		return nil, err
	}
	e, err := d.ctrl.PlanKeyRotation(ctx, id, r.Secrets)
	if err != nil {
		return nil, err
	}
	return &opsapi.KeyRotation{VolumeID: id.String(), KMSID: e.KMSID, KeyOwner: e.KeyOwner, WrappedKey: e.WrappedKey, NextWrappedKey: e.NextWrappedKey}, nil
}

// rekeyOnNode is step 2, on the node plugin that stages the volume.
func (d *Driver) rekeyOnNode(ctx context.Context, r opsapi.KeyRotation) (*opsapi.RotatedKey, error) {
	id, err := lookupVolumeID("volumeID", r.VolumeID)
	if err != nil {
		return nil, err
	}
	if r.WrappedKey == "" || r.NextWrappedKey == "" || r.KeyOwner == "" {
		return nil, errdefs.InvalidArgument("a key rotation names the key owner, the wrapped key and the next wrapped key")
	}
	k, err := d.kms.Get(r.KMSID)
	if err != nil {
		return nil, err
	}
	// A Spindle volume ID (pre-provisioned volumes are never encrypted,
	// static.go), so no volume context is needed to resolve it.
	t, release, err := d.lockNodeVolume(id.String(), nil)
	if err != nil {
		return nil, err
	}
	defer release()
	staging, err := d.node.StagingPathOf(id.String())
	if err != nil {
		return nil, err
	}
	if staging == "" {
		return nil, errdefs.NotFound("volume %s is not staged on node %s; its key is rotated on the node that stages it", id, d.opts.NodeID)
	}
	unwrap := func(wrapped string) func(context.Context) ([]byte, error) {
		return func(ctx context.Context) ([]byte, error) { return k.Unwrap(ctx, r.KeyOwner, wrapped, r.Secrets) }
	}
	if err := d.node.RotateKey(ctx, t.vol, staging, unwrap(r.WrappedKey), unwrap(r.NextWrappedKey)); err != nil {
		return nil, err
	}
	return &opsapi.RotatedKey{VolumeID: id.String(), Node: d.opts.NodeID, StagingPath: staging}, nil
}

// commitKey is step 3.
func (d *Driver) commitKey(ctx context.Context, r opsapi.CommitKeyRequest) (struct{}, error) {
	id, err := lookupVolumeID("volumeID", r.VolumeID)
	if err != nil {
		return struct{}{}, err
	}
	return struct{}{}, d.ctrl.CommitKey(ctx, id, r.NextWrappedKey)
}

// registerRotation adds the key-rotation endpoints of this process's mode.
func (d *Driver) registerRotation(mux *http.ServeMux) {
	if d.opts.Mode.Controller() {
		mux.HandleFunc("POST "+opsapi.PathRotateKey, servePost(d, rotationTimeout, d.planKeyRotation))
		mux.HandleFunc("POST "+opsapi.PathCommitKey, servePost(d, rotationTimeout, d.commitKey))
	}
	if d.opts.Mode.Node() {
		mux.HandleFunc("POST "+opsapi.PathRekey, servePost(d, rotationTimeout, d.rekeyOnNode))
	}
}
