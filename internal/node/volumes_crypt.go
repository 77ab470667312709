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
	// OtherPassphrases are tried, in order, when Passphrase does not open
	// the header: the one a key rotation under way adds (the current one
	// may be gone already), and the one the last rotation replaced (it
	// may not have reached this header).
	OtherPassphrases []func(ctx context.Context) ([]byte, error)
}

// encryptionKeys checks that this node can open LUKS volumes and fetches
// the volume's passphrase, and the next one during a key rotation.
func (v *Volumes) encryptionKeys(ctx context.Context, r StageRequest) ([][]byte, error) {
	if err := v.host.CryptAvailable(ctx); err != nil {
		return nil, errdefs.Wrap(errdefs.KindOf(err), err, "volume %s is encrypted", r.ID)
	}
	fetch := append([]func(context.Context) ([]byte, error){r.Encryption.Passphrase}, r.Encryption.OtherPassphrases...)
	var keys [][]byte
	for _, f := range fetch {
		key, err := f(ctx)
		if err == nil && len(key) == 0 {
			err = errdefs.Precondition("volume %s is encrypted, but %s gave an empty key", r.ID, r.Encryption.KMS)
		}
		if err != nil {
			clearKeys(keys)
			return nil, err
		}
		keys = append(keys, key)
	}
	return keys, nil
}

func clearKeys(keys [][]byte) {
	for _, k := range keys {
		clear(k)
	}
}

// openEncrypted opens the volume's LUKS volume on dev as its dm-crypt
// mapping, making the LUKS2 header first (with keys[0]) only when blkid
// finds nothing at all on dev (the rule mkfs follows). A device that holds
// anything but a LUKS header is refused untouched, and so is a header none
// of keys opens. It reports whether it opened the mapping (false: the
// mapping was open already, after a plugin restart).
func (v *Volumes) openEncrypted(ctx context.Context, r StageRequest, dev *backend.Device, keys [][]byte) (*CryptMapping, bool, error) {
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
		if err := v.host.LUKSFormat(ctx, dev.Path, keys[0]); err != nil {
			return nil, false, err
		}
		v.log.Info("created LUKS2 header", zap.String("volumeID", r.ID), zap.String("device", dev.Path))
	}
	for i, key := range keys {
		err = v.host.LUKSOpen(ctx, dev.Path, name, key, readOnly)
		if err == nil || errdefs.KindOf(err) != errdefs.ErrPrecondition || i == len(keys)-1 {
			break
		}
		// The old key of a rotation under way was removed already.
	}
	if err != nil {
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

// RotateKey replaces the passphrase of the encrypted volume staged at
// staging, while it is in use: the next passphrase goes into a free LUKS
// keyslot, is proven to open the header, and only then is the current
// passphrase's keyslot destroyed. The data and the volume key do not
// change, so the open mapping and every writer carry on. A rotation that
// stopped part-way is finished by running it again: a header the next
// passphrase already opens only loses the current one.
func (v *Volumes) RotateKey(ctx context.Context, vol Volume, staging string, current, next func(context.Context) ([]byte, error)) error {
	p, err := v.Locate(ctx, vol, staging)
	if err != nil {
		return err
	}
	switch {
	case !p.Mine || p.Crypt == nil:
		return errdefs.Precondition("volume %s is not staged at %s with its dm-crypt mapping open (it holds %s); the key is rotated on the node that stages it", vol.ID, staging, p.Holds())
	case p.DeviceReadOnly || p.Crypt.ReadOnly:
		return errdefs.Precondition("volume %s is attached read-only at %s; its LUKS header cannot be changed there", vol.ID, staging)
	}
	dev := p.Device
	cur, err := current(ctx)
	if err != nil {
		return err
	}
	defer clear(cur)
	nxt, err := next(ctx)
	if err != nil {
		return err
	}
	defer clear(nxt)
	opens := func(key []byte) (bool, error) { return v.host.LUKSTestKey(ctx, dev, key) }
	ok, err := opens(nxt)
	if err != nil {
		return err
	}
	if !ok {
		if err := v.host.LUKSAddKey(ctx, dev, cur, nxt); err != nil {
			return fmt.Errorf("volume %s: %w", vol.ID, err)
		}
		if ok, err = opens(nxt); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("volume %s: the key just added to the LUKS header on %s does not open it; the current key stays", vol.ID, dev)
		}
	}
	// Only now that the next key opens the header is the current one
	// destroyed (cryptsetup would remove the last keyslot without asking).
	if ok, err := opens(cur); err != nil {
		return err
	} else if ok {
		if err := v.host.LUKSRemoveKey(ctx, dev, cur); err != nil {
			return fmt.Errorf("volume %s: %w", vol.ID, err)
		}
	}
	v.log.Info("rotated the LUKS key", zap.String("volumeID", vol.ID), zap.String("device", dev))
	return nil
}

// StagingPathOf finds where the volume is staged on this node, from the
// stage records below Options.StageRecordsRoot ("" when nowhere).
func (v *Volumes) StagingPathOf(volumeID string) (string, error) {
	if v.opts.StageRecordsRoot == "" {
		return "", errdefs.Precondition("the node plugin does not know where kubelet's staging paths are (--kubelet-dir)")
	}
	mounts, err := v.host.Mounts()
	if err != nil {
		return "", err
	}
	recs, err := v.host.StageRecords(v.opts.StageRecordsRoot, mounts)
	if err != nil {
		return "", err
	}
	for _, r := range recs {
		if r.Record.VolumeID == volumeID {
			return r.StagingPath, nil
		}
	}
	return "", nil
}
