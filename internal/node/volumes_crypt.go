package node

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Encryption is how a stage gets an encrypted volume's passphrase. The node
// side never sees where it is kept: Passphrase unwraps it (through the KMS
// the volume names) only when a LUKS header must be made or opened.
type Encryption struct {
	// KMS names where the key is kept, for messages.
	KMS string
	// Passphrase returns the volume's passphrase; its error names the KMS
	// and never holds key material. The caller clears what it returns.
	Passphrase func(ctx context.Context) ([]byte, error)
}

// encryptionKey checks that this node can open LUKS volumes and fetches the
// volume's passphrase.
func (v *Volumes) encryptionKey(ctx context.Context, r StageRequest) ([]byte, error) {
	if err := v.host.CryptAvailable(ctx); err != nil {
		return nil, errdefs.Wrap(errdefs.KindOf(err), err, "volume %s is encrypted", r.ID)
	}
	key, err := r.Encryption.Passphrase(ctx)
	if err != nil {
		return nil, err
	}
	if len(key) == 0 {
		return nil, errdefs.Precondition("volume %s is encrypted, but %s gave an empty key", r.ID, r.Encryption.KMS)
	}
	return key, nil
}

// openEncrypted opens the volume's LUKS volume on dev as its dm-crypt
// mapping, making the LUKS2 header first only when blkid finds nothing at
// all on dev (the rule mkfs follows). A device that holds anything but a
// LUKS header is refused untouched, and so is a header the volume's key
// does not open. It reports whether it opened the mapping (false: the
// mapping was open already, after a plugin restart).
func (v *Volumes) openEncrypted(ctx context.Context, r StageRequest, dev *backend.Device, passphrase []byte) (*CryptMapping, bool, error) {
	name := CryptName(r.ID)
	m, err := v.host.CryptMappingByName(name)
	if err != nil {
		return nil, false, err
	}
	readOnly := dev.ReadOnly || r.ReadOnly || r.Mode.ReadOnly()
	if m.Found() {
		if m.Backing != dev.Path {
			return nil, false, errdefs.Precondition("dm-crypt mapping %s of volume %s is open on %s, not on the volume's device %s; the node plugin leaves it as it is (close it with cryptsetup close %s)", name, r.ID, m.Backing, dev.Path, name)
		}
		if !m.ReadOnly {
			// The device may have grown while the plugin was away.
			if err := v.host.LUKSResize(ctx, name); err != nil {
				return nil, false, err
			}
		}
		return &m, false, nil
	}
	sig, err := v.host.Probe(ctx, dev.Path)
	if err != nil {
		return nil, false, err
	}
	switch {
	case sig.Type == "crypto_LUKS":
	case !sig.Blank():
		return nil, false, errdefs.Precondition("%s holds %s, not a LUKS header; volume %s is encrypted, so the node plugin refuses to encrypt over it or to use it unencrypted (its data is untouched)", dev.Path, sig, r.ID)
	case dev.Formatted:
		return nil, false, errdefs.Precondition("volume %s was formatted before, but blkid finds no LUKS header on %s; refusing to format it again (check the image for damage)", r.ID, dev.Path)
	case readOnly:
		return nil, false, errdefs.Precondition("%s holds no LUKS header and is attached read-only, so it cannot be encrypted; publish it writable once first", dev.Path)
	default:
		if size, err := v.host.DeviceSize(dev.Path); err != nil {
			return nil, false, errdefs.Wrap(errdefs.ErrPrecondition, err, "refusing to format %s: it is not a usable block device", dev.Path)
		} else if size <= luksDataOffset {
			return nil, false, errdefs.Precondition("refusing to encrypt %s: its %d bytes do not hold a LUKS2 header (%d bytes) and data", dev.Path, size, luksDataOffset)
		}
		if err := v.host.LUKSFormat(ctx, dev.Path, passphrase); err != nil {
			return nil, false, err
		}
		v.log.Info("created LUKS2 header", zap.String("volumeID", r.ID), zap.String("device", dev.Path))
	}
	if err := v.host.LUKSOpen(ctx, dev.Path, name, passphrase, readOnly); err != nil {
		return nil, false, fmt.Errorf("volume %s: %w", r.ID, err)
	}
	if m, err = v.host.CryptMappingByName(name); err != nil || !m.Found() {
		if cerr := v.host.LUKSClose(context.WithoutCancel(ctx), name); cerr != nil {
			v.log.Error("close a dm-crypt mapping that cannot be read back", zap.String("mapping", name), zap.Error(cerr))
		}
		if err == nil {
			err = fmt.Errorf("dm-crypt mapping %s of volume %s was opened but is not in /sys/dev/block", name, r.ID)
		}
		return nil, false, err
	}
	return &m, true, nil
}

// heldDevice answers whether the volume's attached device dev is in use,
// and by which device: dev itself, or the volume's open dm-crypt mapping
// over it, which holds dev but is itself in use only when mounted or
// opened. It returns the device in use ("" when none).
func (v *Volumes) heldDevice(vol Volume, dev string) (string, error) {
	held, err := v.host.DeviceHeld(dev)
	if err != nil || !held {
		return "", err
	}
	m, err := v.host.CryptMappingByName(CryptName(vol.ID))
	if err != nil {
		return "", err
	}
	if !m.Found() || m.Backing != dev {
		return dev, nil
	}
	if held, err = v.host.DeviceHeld(m.Path); err != nil || !held {
		return "", err
	}
	return m.Path, nil
}

// closeCrypt closes the volume's dm-crypt mapping if it is open on one of
// the volume's devices; one on another device is not the volume's.
func (v *Volumes) closeCrypt(ctx context.Context, vol Volume) error {
	name := CryptName(vol.ID)
	m, err := v.host.CryptMappingByName(name)
	if err != nil || !m.Found() {
		return err
	}
	mine, _, err := identify(ctx, vol, m.Backing)
	if err != nil {
		return err
	}
	if !mine {
		return errdefs.Precondition("dm-crypt mapping %s is open on %s, which is not a device of volume %s; the node plugin leaves it as it is", name, m.Backing, vol.ID)
	}
	return v.host.LUKSClose(ctx, name)
}
