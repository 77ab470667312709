package node

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// FakeHost's dm-crypt: LUKS headers kept per device identity (so an image
// attached again on another device still holds its header and keys), and
// open mappings as block devices /dev/mapper/<name> whose filesystems
// belong to the decrypted data, not to the raw device. cryptsetup's
// answers are the ones cryptsetup 2.6 prints.

// luksDataOffset is where the LUKS2 header ends and the data starts.
const luksDataOffset = blockdev.LUKSHeaderBytes

// fakeCryptMajor is the device-mapper major number the fake gives mappings.
const fakeCryptMajor = 253

type fakeLUKS struct {
	keyslots [][]byte
}

type fakeCryptMapping struct {
	name     string
	backing  string
	minor    uint32
	size     int64
	readOnly bool
}

// cryptsetupError is the error cryptsetup's exit with stderr makes.
func cryptsetupError(args []string, code int, stderr string) error {
	return &command.Error{Name: "cryptsetup", Args: args, ExitCode: code, Stderr: stderr, Err: fmt.Errorf("exit status %d", code)}
}

// SetCryptUnavailable makes CryptAvailable answer as a node whose kernel
// has no device mapper does (nil: dm-crypt works).
func (f *FakeHost) SetCryptUnavailable(unavailable bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cryptUnavailable = unavailable
}

// LUKSKeyslots returns the keys of the LUKS header on the data behind
// identity, in keyslot order; nil when it holds no header.
func (f *FakeHost) LUKSKeyslots(identity string) [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.luks[identity]; h != nil {
		return slices.Clone(h.keyslots)
	}
	return nil
}

// CryptMappings lists the names of the open mappings.
func (f *FakeHost) CryptMappings() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for name := range f.crypts {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// PutLUKSHeader puts a LUKS header opened by passphrase on the data behind
// identity, as if it had been made earlier (another volume's header).
func (f *FakeHost) PutLUKSHeader(identity string, passphrase []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.putLUKSLocked(identity, passphrase)
}

func (f *FakeHost) putLUKSLocked(identity string, passphrase []byte) {
	if f.luks == nil {
		f.luks = map[string]*fakeLUKS{}
	}
	f.luks[identity] = &fakeLUKS{keyslots: [][]byte{bytes.Clone(passphrase)}}
	f.nextIno++
	f.filesystems[identity] = &fakeFilesystem{fsType: "crypto_LUKS", ino: f.nextIno}
	delete(f.filesystems, cryptIdentity(identity))
}

// cryptIdentity is the identity of the decrypted data behind identity: a
// filesystem made on a mapping belongs to it.
func cryptIdentity(identity string) string { return "luks:" + identity }

func (f *FakeHost) CryptAvailable(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cryptUnavailable {
		return errdefs.Precondition("this node's kernel has no device mapper, which encrypted volumes need: kernel modules dm_mod and dm_crypt are not loaded; load dm_crypt on the node or run encrypted volumes on nodes that have it")
	}
	return nil
}

// header returns the LUKS header on dev, or the error cryptsetup gives.
func (f *FakeHost) header(dev string, args []string) (FakeDevice, *fakeLUKS, error) {
	d, ok := f.device(dev)
	if !ok {
		return FakeDevice{}, nil, cryptsetupError(args, 4, "Device "+dev+" does not exist or access denied.")
	}
	h := f.luks[d.Identity]
	if h == nil || f.filesystems[d.Identity] == nil || f.filesystems[d.Identity].fsType != "crypto_LUKS" {
		return FakeDevice{}, nil, cryptsetupError(args, 1, "Device "+dev+" is not a valid LUKS device.")
	}
	return d, h, nil
}

func (h *fakeLUKS) slotOf(passphrase []byte) int {
	return slices.IndexFunc(h.keyslots, func(k []byte) bool { return k != nil && bytes.Equal(k, passphrase) })
}

func (f *FakeHost) LUKSFormat(_ context.Context, dev string, passphrase []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("luksFormat " + dev); err != nil {
		return err
	}
	args := append(slices.Clone(luksFormatArgs), dev)
	d, ok := f.device(dev)
	switch {
	case !ok:
		return fmt.Errorf("create the LUKS2 header on %s: %w", dev, cryptsetupError(args, 4, "Device "+dev+" does not exist or access denied."))
	case d.ReadOnly:
		return fmt.Errorf("create the LUKS2 header on %s: %w", dev, cryptsetupError(args, 5, "Cannot format device "+dev+" in use."))
	}
	f.putLUKSLocked(d.Identity, passphrase)
	return nil
}

func (f *FakeHost) LUKSOpen(_ context.Context, dev, name string, passphrase []byte, readOnly bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("luksOpen " + dev + " " + name); err != nil {
		return err
	}
	args := []string{"open", "--type", "luks2", "--disable-keyring", "--key-file=-", dev, name}
	d, h, err := f.header(dev, args)
	if err != nil {
		return fmt.Errorf("open the LUKS2 volume on %s: %w", dev, err)
	}
	if _, open := f.crypts[name]; open {
		return fmt.Errorf("open the LUKS2 volume on %s: %w", dev, cryptsetupError(args, 5, "Device "+name+" already exists."))
	}
	for _, c := range f.crypts {
		if c.backing == dev {
			return fmt.Errorf("open the LUKS2 volume on %s: %w", dev, cryptsetupError(args, 5, "Cannot use device "+dev+" which is in use (already mapped or mounted)."))
		}
	}
	if h.slotOf(passphrase) < 0 {
		return errdefs.Wrap(errdefs.ErrPrecondition, cryptsetupError(args, 2, "No key available with this passphrase."), "the volume's key does not open the LUKS header on %s", dev)
	}
	if f.crypts == nil {
		f.crypts = map[string]*fakeCryptMapping{}
	}
	f.nextCryptMinor++
	f.crypts[name] = &fakeCryptMapping{name: name, backing: dev, minor: f.nextCryptMinor, size: max(d.Size-luksDataOffset, 0), readOnly: readOnly || d.ReadOnly}
	return nil
}

func (f *FakeHost) LUKSClose(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("luksClose " + name); err != nil {
		return err
	}
	if _, open := f.crypts[name]; !open {
		return nil // cryptsetup exits 4: "Device NAME is not active."
	}
	for _, m := range f.mounts {
		if m.device == MapperPath(name) {
			return errdefs.Wrap(errdefs.ErrPrecondition, cryptsetupError([]string{"close", name}, 5, "Device "+name+" is still in use."), "dm-crypt mapping %s is still in use", name)
		}
	}
	delete(f.crypts, name)
	return nil
}

func (f *FakeHost) LUKSResize(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("luksResize " + name); err != nil {
		return err
	}
	c := f.crypts[name]
	if c == nil {
		return fmt.Errorf("grow dm-crypt mapping %s to its device's size: %w", name, cryptsetupError([]string{"resize", name}, 4, "Device "+name+" is not active."))
	}
	d, _ := f.device(c.backing)
	c.size = max(d.Size-luksDataOffset, 0)
	return nil
}

func (f *FakeHost) LUKSAddKey(_ context.Context, dev string, existing, added []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("luksAddKey " + dev); err != nil {
		return err
	}
	args := append(append([]string{"luksAddKey"}, keyslotArgs...), "--key-file=-", dev, "/tmp/spindle-key-0/key")
	_, h, err := f.header(dev, args)
	if err != nil {
		return fmt.Errorf("add a LUKS key to %s: %w", dev, err)
	}
	if h.slotOf(existing) < 0 {
		return errdefs.Wrap(errdefs.ErrPrecondition, cryptsetupError(args, 2, "No key available with this passphrase."), "the volume's current key does not open the LUKS header on %s", dev)
	}
	if free := slices.IndexFunc(h.keyslots, func(k []byte) bool { return k == nil }); free >= 0 {
		h.keyslots[free] = bytes.Clone(added)
	} else {
		h.keyslots = append(h.keyslots, bytes.Clone(added))
	}
	return nil
}

func (f *FakeHost) LUKSRemoveKey(_ context.Context, dev string, passphrase []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("luksRemoveKey " + dev); err != nil {
		return err
	}
	args := []string{"luksRemoveKey", "--key-file=-", dev}
	_, h, err := f.header(dev, args)
	if err != nil {
		return fmt.Errorf("remove a LUKS key from %s: %w", dev, err)
	}
	slot := h.slotOf(passphrase)
	if slot < 0 {
		return errdefs.Wrap(errdefs.ErrNotFound, cryptsetupError(args, 2, "No key available with this passphrase."), "no keyslot of the LUKS header on %s holds that key", dev)
	}
	h.keyslots[slot] = nil
	return nil
}

func (f *FakeHost) LUKSTestKey(_ context.Context, dev string, passphrase []byte) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("luksTest " + dev); err != nil {
		return false, err
	}
	_, h, err := f.header(dev, []string{"open", "--test-passphrase", "--type", "luks2", "--key-file=-", dev})
	if err != nil {
		return false, fmt.Errorf("test a key on the LUKS header of %s: %w", dev, err)
	}
	return h.slotOf(passphrase) >= 0, nil
}

func (f *FakeHost) CryptMapping(dev string) (CryptMapping, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	name, ok := strings.CutPrefix(dev, "/dev/mapper/")
	if !ok {
		return CryptMapping{}, nil
	}
	return f.cryptMappingLocked(name), nil
}

func (f *FakeHost) CryptMappingByName(name string) (CryptMapping, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cryptMappingLocked(name), nil
}

func (f *FakeHost) cryptMappingLocked(name string) CryptMapping {
	c := f.crypts[name]
	if c == nil {
		return CryptMapping{}
	}
	return CryptMapping{Name: name, Path: MapperPath(name), Num: DevNum{fakeCryptMajor, c.minor}, Backing: c.backing, ReadOnly: c.readOnly}
}

// cryptDevice is the block device of an open mapping at path.
func (f *FakeHost) cryptDevice(path string) (FakeDevice, bool) {
	name, ok := strings.CutPrefix(path, "/dev/mapper/")
	if !ok {
		return FakeDevice{}, false
	}
	c := f.crypts[name]
	if c == nil {
		return FakeDevice{}, false
	}
	backing, ok := f.devices[c.backing]
	if !ok && f.Devices != nil {
		backing, ok = f.Devices(c.backing)
	}
	if !ok {
		return FakeDevice{}, false
	}
	return FakeDevice{Num: DevNum{fakeCryptMajor, c.minor}, Size: c.size, Identity: cryptIdentity(backing.Identity), ReadOnly: c.readOnly}, true
}

// cryptHolds reports whether an open mapping holds dev.
func (f *FakeHost) cryptHolds(dev string) bool {
	for _, c := range f.crypts {
		if c.backing == dev {
			return true
		}
	}
	return false
}
