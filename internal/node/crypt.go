package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// dm-crypt on the node. An encrypted volume is a LUKS2 header on the
// attached device, opened with cryptsetup into a mapping named after the
// volume; its filesystem (or the block device a pod gets) is on that
// mapping. The passphrase reaches cryptsetup on its stdin, or in a 0600
// file in a private directory that is removed after the call: never on a
// command line, in the environment, in a log line or in an error.

// CryptMapping is an open dm-crypt mapping.
type CryptMapping struct {
	Name string // the device-mapper name: /dev/mapper/<Name>
	// Path is the mapping's device node as the kernel names it (/dev/dm-N).
	Path string
	Num  DevNum
	// Backing is the device the mapping decrypts (the attached device).
	Backing  string
	ReadOnly bool
}

// Found reports whether a mapping was found.
func (m CryptMapping) Found() bool { return m.Name != "" }

// MapperPath is /dev/mapper/<name>, the mapping's stable name.
func MapperPath(name string) string { return "/dev/mapper/" + name }

// CryptName is the device-mapper name of a volume's mapping: one per volume
// on a node, so a stage after a plugin restart finds the mapping it opened.
// A hash keeps it within device mapper's 127 bytes and its charset.
func CryptName(volumeID string) string {
	sum := sha256.Sum256([]byte(volumeID))
	return "spindle-" + hex.EncodeToString(sum[:12])
}

// LUKS settings. The passphrase is 256 random bits (see kms), so a slow
// key derivation adds nothing but stage latency and memory (argon2id's
// default is up to 1 GiB per open): PBKDF2 at cryptsetup's minimum.
// 4096-byte encryption sectors, as the loop devices use. The header these
// make takes blockdev.LUKSHeaderBytes of the device, which the controller
// adds to an encrypted volume's size.
var luksFormatArgs = []string{
	"luksFormat", "--type", "luks2", "--batch-mode",
	"--cipher", "aes-xts-plain64", "--key-size", "512", "--sector-size", "4096",
	"--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", "--hash", "sha256",
	"--key-file=-",
}

// keyslotArgs are the key-derivation settings of a slot added by rotation.
var keyslotArgs = []string{"--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", "--hash", "sha256"}

// cryptsetup exit statuses (cryptsetup(8)).
const (
	cryptsetupNoPermission = 2 // "No key available with this passphrase."
	cryptsetupNotActive    = 4
	cryptsetupBusy         = 5
)

// CryptAvailable implements Host: the device mapper (dm_mod) and its crypt
// target (dm_crypt) are in the kernel, loading dm_crypt if it is a module
// not yet loaded. A node without them refuses encrypted volumes with
// ErrPrecondition naming the module, before anything is attached.
func (h *LinuxHost) CryptAvailable(ctx context.Context) error {
	if h.cryptReady.Load() {
		return nil
	}
	if !deviceMapperPresent(h.procMisc) {
		// modprobe dm_crypt loads dm_mod too; its failure is reported below.
		_, modErr := h.run.Run(ctx, "modprobe", "dm_crypt")
		if !deviceMapperPresent(h.procMisc) {
			return errdefs.Precondition("this node's kernel has no device mapper, which encrypted volumes need: kernel modules dm_mod and dm_crypt are not loaded%s; load dm_crypt on the node or run encrypted volumes on nodes that have it", loadFailure(modErr))
		}
	}
	if ok, err := h.cryptTarget(ctx); err != nil {
		return err
	} else if !ok {
		_, modErr := h.run.Run(ctx, "modprobe", "dm_crypt")
		if ok, err = h.cryptTarget(ctx); err != nil {
			return err
		} else if !ok {
			return errdefs.Precondition("this node's device mapper has no crypt target, which encrypted volumes need: kernel module dm_crypt is not loaded%s; load it on the node or run encrypted volumes on nodes that have it", loadFailure(modErr))
		}
	}
	h.cryptReady.Store(true)
	return nil
}

func loadFailure(err error) string {
	if err == nil {
		return ""
	}
	return " and could not be loaded (" + err.Error() + ")"
}

// deviceMapperPresent reports whether the kernel's misc devices include
// the device mapper's control device (dm_mod loaded or built in).
func deviceMapperPresent(procMisc string) bool {
	data, err := os.ReadFile(procMisc)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == "device-mapper" {
			return true
		}
	}
	return false
}

// cryptTarget asks the device mapper whether it has the crypt target.
func (h *LinuxHost) cryptTarget(ctx context.Context) (bool, error) {
	out, err := h.run.Run(ctx, "dmsetup", "targets")
	if err != nil {
		return false, errdefs.Wrap(errdefs.ErrPrecondition, err, "cannot list the device mapper's targets (is kernel module dm_mod loaded?)")
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "crypt" {
			return true, nil
		}
	}
	return false, nil
}

// cryptsetup runs cryptsetup with the passphrase on its stdin; args never
// hold it.
func (h *LinuxHost) cryptsetup(ctx context.Context, passphrase []byte, args ...string) error {
	_, err := h.run.Exec(ctx, command.Cmd{Name: "cryptsetup", Args: args, Stdin: passphrase})
	return err
}

// LUKSFormat implements Host. Like mkfs it is never cut short once started.
func (h *LinuxHost) LUKSFormat(ctx context.Context, dev string, passphrase []byte) error {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), mkfsTimeout)
	defer cancel()
	if err := h.cryptsetup(fctx, passphrase, append(append([]string{}, luksFormatArgs...), dev)...); err != nil {
		return fmt.Errorf("create the LUKS2 header on %s: %w", dev, err)
	}
	return nil
}

// LUKSOpen implements Host. The volume key stays in the dm table rather
// than the kernel keyring (--disable-keyring), so that "cryptsetup resize"
// grows the mapping on NodeExpandVolume without the passphrase, which that
// request does not carry.
func (h *LinuxHost) LUKSOpen(ctx context.Context, dev, name string, passphrase []byte, readOnly bool) error {
	args := []string{"open", "--type", "luks2", "--disable-keyring", "--key-file=-"}
	if readOnly {
		args = append(args, "--readonly")
	}
	err := h.cryptsetup(ctx, passphrase, append(args, dev, name)...)
	switch {
	case err == nil:
		return nil
	case command.ExitCode(err) == cryptsetupNoPermission:
		return errdefs.Wrap(errdefs.ErrPrecondition, err, "the volume's key does not open the LUKS header on %s", dev)
	}
	return fmt.Errorf("open the LUKS2 volume on %s: %w", dev, err)
}

// LUKSClose implements Host: a mapping that is not open is fine; one in use
// is ErrPrecondition. Right after an unmount udev's probe of the mapping
// can hold it for a moment, so a busy close is tried a few times.
func (h *LinuxHost) LUKSClose(ctx context.Context, name string) error {
	var err error
	for attempt := 0; ; attempt++ {
		err = h.cryptsetup(ctx, nil, "close", name)
		switch code := command.ExitCode(err); {
		case err == nil, code == cryptsetupNotActive:
			return nil
		case code != cryptsetupBusy:
			return fmt.Errorf("close dm-crypt mapping %s: %w", name, err)
		case attempt == closeAttempts-1:
			return errdefs.Wrap(errdefs.ErrPrecondition, err, "dm-crypt mapping %s is still in use", name)
		}
		select {
		case <-ctx.Done():
			return errdefs.Wrap(errdefs.ErrPrecondition, err, "dm-crypt mapping %s is still in use", name)
		case <-time.After(closeRetryDelay):
		}
	}
}

// A busy close is tried closeAttempts times, closeRetryDelay apart.
const (
	closeAttempts   = 5
	closeRetryDelay = 200 * time.Millisecond
)

// LUKSResize implements Host: the mapping grows to fill its backing device.
func (h *LinuxHost) LUKSResize(ctx context.Context, name string) error {
	if err := h.cryptsetup(ctx, nil, "resize", name); err != nil {
		return fmt.Errorf("grow dm-crypt mapping %s to its device's size: %w", name, err)
	}
	return nil
}

// LUKSAddKey implements Host: added goes into a free keyslot, unlocked with
// existing (on stdin); added travels in a 0600 file in a private directory,
// removed before this returns.
func (h *LinuxHost) LUKSAddKey(ctx context.Context, dev string, existing, added []byte) error {
	dir, err := os.MkdirTemp("", "spindle-key-")
	if err != nil {
		return fmt.Errorf("add a LUKS key to %s: %w", dev, err)
	}
	defer os.RemoveAll(dir)
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, added, 0o600); err != nil {
		return fmt.Errorf("add a LUKS key to %s: %w", dev, err)
	}
	args := append(append([]string{"luksAddKey"}, keyslotArgs...), "--key-file=-", dev, keyFile)
	if err := h.cryptsetup(ctx, existing, args...); err != nil {
		if command.ExitCode(err) == cryptsetupNoPermission {
			return errdefs.Wrap(errdefs.ErrPrecondition, err, "the volume's current key does not open the LUKS header on %s", dev)
		}
		return fmt.Errorf("add a LUKS key to %s: %w", dev, err)
	}
	return nil
}

// LUKSRemoveKey implements Host: the keyslot that passphrase opens is
// destroyed. cryptsetup removes the last keyslot too without asking when
// its stdin is no terminal, so the caller proves first that another key
// opens the header.
func (h *LinuxHost) LUKSRemoveKey(ctx context.Context, dev string, passphrase []byte) error {
	if err := h.cryptsetup(ctx, passphrase, "luksRemoveKey", "--key-file=-", dev); err != nil {
		if command.ExitCode(err) == cryptsetupNoPermission {
			return errdefs.Wrap(errdefs.ErrNotFound, err, "no keyslot of the LUKS header on %s holds that key", dev)
		}
		return fmt.Errorf("remove a LUKS key from %s: %w", dev, err)
	}
	return nil
}

// LUKSTestKey implements Host: whether passphrase opens a keyslot.
func (h *LinuxHost) LUKSTestKey(ctx context.Context, dev string, passphrase []byte) (bool, error) {
	err := h.cryptsetup(ctx, passphrase, "open", "--test-passphrase", "--type", "luks2", "--key-file=-", dev)
	switch {
	case err == nil:
		return true, nil
	case command.ExitCode(err) == cryptsetupNoPermission:
		return false, nil
	}
	return false, fmt.Errorf("test a key on the LUKS header of %s: %w", dev, err)
}

// CryptMapping implements Host: the dm-crypt mapping whose device node is
// dev, read from sysfs; none when dev is no such mapping.
func (h *LinuxHost) CryptMapping(dev string) (CryptMapping, error) {
	major, minor, ok, err := h.blockDeviceAt(dev)
	if err != nil || !ok {
		return CryptMapping{}, nil
	}
	return h.cryptMappingOf(DevNum{major, minor})
}

// CryptMappingByName implements Host.
func (h *LinuxHost) CryptMappingByName(name string) (CryptMapping, error) {
	m, err := h.CryptMapping(MapperPath(name))
	if err != nil || m.Name != name {
		return CryptMapping{}, err
	}
	return m, nil
}

// cryptMappingOf reads /sys/dev/block/M:m/dm: a device-mapper device whose
// uuid starts CRYPT- is a dm-crypt mapping, and its one slave is the
// device it decrypts.
func (h *LinuxHost) cryptMappingOf(n DevNum) (CryptMapping, error) {
	dir := filepath.Join(h.sysDevBlock, n.String())
	uuid, err := os.ReadFile(filepath.Join(dir, "dm", "uuid"))
	if os.IsNotExist(err) {
		return CryptMapping{}, nil // not a device-mapper device
	}
	if err != nil {
		return CryptMapping{}, err
	}
	if !strings.HasPrefix(string(uuid), "CRYPT-") {
		return CryptMapping{}, nil
	}
	name, err := os.ReadFile(filepath.Join(dir, "dm", "name"))
	if err != nil {
		return CryptMapping{}, err
	}
	slaves, err := os.ReadDir(filepath.Join(dir, "slaves"))
	if err != nil {
		return CryptMapping{}, err
	}
	if len(slaves) != 1 {
		return CryptMapping{}, fmt.Errorf("dm-crypt mapping %s (%s) has %d devices under it, not one", strings.TrimSpace(string(name)), n, len(slaves))
	}
	ro, _ := os.ReadFile(filepath.Join(dir, "ro"))
	target, _ := os.Readlink(dir)
	return CryptMapping{
		Name: strings.TrimSpace(string(name)), Path: "/dev/" + filepath.Base(target), Num: n,
		Backing: "/dev/" + slaves[0].Name(), ReadOnly: strings.TrimSpace(string(ro)) == "1",
	}, nil
}
