package driver

import (
	"context"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/kms"
	"github.com/spindle-csi/spindle/internal/opsapi"
)

// Key rotation of an encrypted volume while it is in use, in three steps
// that kubectl-spindle makes through the API server's pod proxy:
//
//  1. the controller makes the next passphrase, wraps it with the volume's
//     KMS and records it beside the current one (Encryption.NextWrappedKey),
//     after proving the request's secrets unwrap the current one;
//  2. the node plugin that stages the volume unwraps both and rekeys the
//     LUKS header (node.Volumes.RotateKey): the next key into a free
//     keyslot, proven, then the current one's keyslot destroyed;
//  3. the controller makes the next key the volume's, keeping the replaced
//     one (PreviousWrappedKey) until the next rotation.
//
// Each step is idempotent and every state between them stages: publish
// carries all three wrapped keys and the node tries them in turn. Only the
// controller writes the image's record (an iSCSI node reads no pool), and
// only the node touches the header (only it has the device).

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
	inst, release, err := d.lockVolume("volume", id)
	if err != nil {
		return nil, err
	}
	defer release()
	keeper, ok := inst.Store.(backend.EncryptionKeeper)
	if !ok {
		return nil, errdefs.Precondition("backend %s cannot change a volume's key", inst.Key())
	}
	img, err := inst.Store.Get(ctx, id.Image)
	if err != nil {
		return nil, err
	}
	if img.Encryption == nil {
		return nil, errdefs.Precondition("volume %s is not encrypted", id)
	}
	e := img.Encryption.Clone()
	cur, err := d.unwrap(ctx, e, r.Secrets)
	if err != nil {
		return nil, err
	}
	clear(cur)
	if e.NextWrappedKey != "" {
		// Resume a rotation that stopped, if its key still unwraps.
		next, err := d.unwrap(ctx, &backend.Encryption{KMSID: e.KMSID, KeyOwner: e.KeyOwner, WrappedKey: e.NextWrappedKey}, r.Secrets)
		clear(next)
		if err != nil {
			d.log.Warn("the next key of an earlier rotation does not unwrap; making another", zap.String("volumeID", id.String()), zap.Error(err))
			e.NextWrappedKey = ""
		}
	}
	if e.NextWrappedKey == "" {
		pass, err := kms.NewPassphrase()
		if err != nil {
			return nil, err
		}
		wrapped, err := d.wrap(ctx, e.KMSID, e.KeyOwner, pass, r.Secrets)
		clear(pass)
		if err != nil {
			return nil, err
		}
		e.NextWrappedKey = wrapped.WrappedKey
		if err := keeper.SetEncryption(ctx, id.Image, e); err != nil {
			return nil, err
		}
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
func (d *Driver) commitKey(ctx context.Context, r opsapi.CommitKeyRequest) error {
	id, err := lookupVolumeID("volumeID", r.VolumeID)
	if err != nil {
		return err
	}
	inst, release, err := d.lockVolume("volume", id)
	if err != nil {
		return err
	}
	defer release()
	keeper, ok := inst.Store.(backend.EncryptionKeeper)
	if !ok {
		return errdefs.Precondition("backend %s cannot change a volume's key", inst.Key())
	}
	img, err := inst.Store.Get(ctx, id.Image)
	if err != nil {
		return err
	}
	e := img.Encryption.Clone()
	switch {
	case e == nil:
		return errdefs.Precondition("volume %s is not encrypted", id)
	case e.WrappedKey == r.NextWrappedKey && r.NextWrappedKey != "":
		return nil // committed before
	case e.NextWrappedKey == "" || e.NextWrappedKey != r.NextWrappedKey:
		return errdefs.Precondition("no rotation of volume %s to that key is under way", id)
	}
	e.PreviousWrappedKey, e.WrappedKey, e.NextWrappedKey = e.WrappedKey, e.NextWrappedKey, ""
	return keeper.SetEncryption(ctx, id.Image, e)
}

// registerRotation adds the key-rotation endpoints of this process's mode.
func (d *Driver) registerRotation(mux *http.ServeMux) {
	if d.opts.Mode.Controller() {
		mux.HandleFunc("POST "+opsapi.PathRotateKey, servePost(d, rotationTimeout, d.planKeyRotation))
		mux.HandleFunc("POST "+opsapi.PathCommitKey, servePost(d, rotationTimeout, func(ctx context.Context, r opsapi.CommitKeyRequest) (struct{}, error) {
			return struct{}{}, d.commitKey(ctx, r)
		}))
	}
	if d.opts.Mode.Node() {
		mux.HandleFunc("POST "+opsapi.PathRekey, servePost(d, rotationTimeout, d.rekeyOnNode))
	}
}
