package driver

import (
	"context"
	"strconv"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/node"
)

// Encrypted volumes on the node: the controller side (internal/controller)
// hands the node the volume's wrapped passphrase in publish_context; the
// node plugin reads it here and the node side (internal/node) unwraps it
// with the stage request's secrets when it opens the volume with dm-crypt.

// stageEncryption reads a NodeStageVolume's encryption: the wrapped key in
// publish_context, unwrapped on demand with the request's secrets. A volume
// whose volume context says it is encrypted but whose publish_context
// carries no key is refused: staging it would format it in clear.
func (d *Driver) stageEncryption(pc, vc map[string]string, secrets map[string]string) (*node.Encryption, error) {
	wrapped := pc[backend.ContextEncryptionWrapped]
	if wrapped == "" {
		if on, _ := strconv.ParseBool(vc[backend.ParamEncrypted]); on {
			return nil, errdefs.Precondition("the volume is encrypted (volume_context.%s), but publish_context carries no %s; it was published by a controller that does not encrypt, and staging it would write it in clear", backend.ParamEncrypted, backend.ContextEncryptionWrapped)
		}
		return nil, nil
	}
	owner := pc[backend.ContextEncryptionOwner]
	if owner == "" {
		return nil, errdefs.InvalidArgument("publish_context.%s is set without %s", backend.ContextEncryptionWrapped, backend.ContextEncryptionOwner)
	}
	k, err := d.kms.Get(pc[backend.ContextEncryptionKMSID])
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrPrecondition, err, "publish_context.%s names a KMS this node does not have (its --kms-config)", backend.ContextEncryptionKMSID)
	}
	unwrap := func(w string) func(context.Context) ([]byte, error) {
		return func(ctx context.Context) ([]byte, error) { return k.Unwrap(ctx, owner, w, secrets) }
	}
	enc := &node.Encryption{KMS: k.String(), Passphrase: unwrap(wrapped)}
	for _, key := range []string{backend.ContextEncryptionNext, backend.ContextEncryptionPrevious} {
		if w := pc[key]; w != "" {
			enc.OtherPassphrases = append(enc.OtherPassphrases, unwrap(w))
		}
	}
	return enc, nil
}
