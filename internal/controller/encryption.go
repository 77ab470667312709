package controller

import (
	"context"
	"maps"
	"strconv"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/kms"
)

// Encrypted volumes. The StorageClass asks for encryption (ceph-csi's
// parameter names), the controller makes a random passphrase per volume
// and has the volume's KMS wrap it (internal/kms), the store keeps the
// wrapped form with the image (and a snapshot its own wrap of the same
// passphrase), Publish hands the wrapped form to the node in
// publish_context, and the node unwraps it with the stage request's
// secrets and opens the volume with dm-crypt (internal/node). The
// passphrase itself is never stored, logged or sent anywhere.

// Key owners: whose passphrase a wrap is, to the KMS (a Vault transit key
// per owner). Volumes and snapshots are named apart.
func volumeKeyOwner(name string) string   { return "volume/" + name }
func snapshotKeyOwner(name string) string { return "snapshot/" + name }

// encryptionParameters validates encrypted and encryptionKMSID and records
// them in the volume's shaping parameters.
func (c *Controller) encryptionParameters(vp *volumeParameters, params map[string]string) error {
	raw, hasEncrypted := params[paramEncrypted]
	kmsID, hasKMS := params[paramEncryptionKMSID]
	if hasEncrypted {
		on, err := strconv.ParseBool(raw)
		if err != nil {
			return errdefs.InvalidArgument("parameters.%s %q is not a boolean", paramEncrypted, raw)
		}
		vp.encrypted = on
	}
	if hasKMS && !vp.encrypted {
		return errdefs.InvalidArgument("parameters.%s %q is set, but parameters.%s is not \"true\"", paramEncryptionKMSID, kmsID, paramEncrypted)
	}
	if !vp.encrypted {
		return nil
	}
	k, err := c.kms.Get(kmsID)
	if err != nil {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, err, "parameters.%s", paramEncryptionKMSID)
	}
	vp.kmsID = k.ID()
	vp.shaping[paramEncrypted] = "true"
	vp.shaping[paramEncryptionKMSID] = k.ID()
	return nil
}

// newVolumeEncryption is the Encryption a new volume is created with: a
// fresh passphrase wrapped by the StorageClass's KMS, or for a copy of an
// encrypted volume or snapshot, the source's passphrase (its LUKS header
// is copied with its data) wrapped again for the new volume. An
// unencrypted source cannot become an encrypted volume: its data would
// stay in clear.
func (c *Controller) newVolumeEncryption(ctx context.Context, name string, vp volumeParameters, source *contentSource) (*backend.Encryption, error) {
	secrets := backend.SecretsFrom(ctx)
	var passphrase []byte
	kmsID := vp.kmsID
	switch {
	case source != nil && source.encryption != nil:
		p, err := c.Unwrap(ctx, source.encryption, secrets)
		if err != nil {
			return nil, err
		}
		passphrase = p
		if !vp.encrypted {
			kmsID = source.encryption.KMSID
		}
	case source != nil && vp.encrypted:
		return nil, errdefs.InvalidArgument("volume_content_source %s is not encrypted; a copy of it keeps its data in clear, so it cannot be an encrypted volume", source.id)
	case vp.encrypted:
		p, err := kms.NewPassphrase()
		if err != nil {
			return nil, err
		}
		passphrase = p
	default:
		return nil, nil
	}
	defer clear(passphrase)
	return c.wrap(ctx, kmsID, volumeKeyOwner(name), passphrase, secrets)
}

// snapshotEncryption wraps an encrypted source volume's passphrase again
// for the snapshot, with the source's KMS: the snapshot then outlives the
// volume's key, which DeleteVolume destroys.
func (c *Controller) snapshotEncryption(ctx context.Context, name string, src *backend.Encryption) (*backend.Encryption, error) {
	if src == nil {
		return nil, nil
	}
	secrets := backend.SecretsFrom(ctx)
	passphrase, err := c.Unwrap(ctx, src, secrets)
	if err != nil {
		return nil, err
	}
	defer clear(passphrase)
	return c.wrap(ctx, src.KMSID, snapshotKeyOwner(name), passphrase, secrets)
}

func (c *Controller) wrap(ctx context.Context, kmsID, owner string, passphrase []byte, secrets map[string]string) (*backend.Encryption, error) {
	k, err := c.kms.Get(kmsID)
	if err != nil {
		return nil, err
	}
	wrapped, err := k.Wrap(ctx, owner, passphrase, secrets)
	if err != nil {
		return nil, err
	}
	return &backend.Encryption{KMSID: k.ID(), KeyOwner: owner, WrappedKey: wrapped}, nil
}

// Unwrap returns the passphrase e wraps, unwrapped by its KMS with secrets.
// The caller clears it once used.
func (c *Controller) Unwrap(ctx context.Context, e *backend.Encryption, secrets map[string]string) ([]byte, error) {
	k, err := c.kms.Get(e.KMSID)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrPrecondition, err, "the key of %s", e.KeyOwner)
	}
	return k.Unwrap(ctx, e.KeyOwner, e.WrappedKey, secrets)
}

// forgetKey destroys what the KMS keeps of e's owner (DeleteVolume,
// DeleteSnapshot).
func (c *Controller) forgetKey(ctx context.Context, e *backend.Encryption) error {
	if e == nil {
		return nil
	}
	k, err := c.kms.Get(e.KMSID)
	if err != nil {
		return errdefs.Wrap(errdefs.ErrPrecondition, err, "delete the key of %s", e.KeyOwner)
	}
	return k.Forget(ctx, e.KeyOwner, backend.SecretsFrom(ctx))
}

// addEncryptionContext puts an encrypted image's wrapped key into the
// publish_context the node stages with.
func addEncryptionContext(pc map[string]string, e *backend.Encryption) map[string]string {
	if e == nil {
		return pc
	}
	out := make(map[string]string, len(pc)+3)
	maps.Copy(out, pc)
	out[backend.ContextEncryptionKMSID], out[backend.ContextEncryptionOwner], out[backend.ContextEncryptionWrapped] = e.KMSID, e.KeyOwner, e.WrappedKey
	if e.NextWrappedKey != "" {
		out[backend.ContextEncryptionNext] = e.NextWrappedKey
	}
	if e.PreviousWrappedKey != "" {
		out[backend.ContextEncryptionPrevious] = e.PreviousWrappedKey
	}
	return out
}
