package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/command/commandtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// cryptsetup's command lines, with the passphrase on stdin only, and its
// answers (as cryptsetup 2.6 prints them) turned into the node's errors.
func TestLUKSCommands(t *testing.T) {
	const dev, name = "/dev/loop3", "spindle-0123"
	key := string(testPassphrase)
	d, script := scriptedHost(t,
		commandtest.Expect("cryptsetup", append(luksFormatArgs, dev)...).Reads(key),
		commandtest.Expect("cryptsetup", "open", "--type", "luks2", "--disable-keyring", "--key-file=-", dev, name).Reads(key),
		commandtest.Expect("cryptsetup", "open", "--type", "luks2", "--disable-keyring", "--key-file=-", "--readonly", dev, name).Reads("wrong").
			Exits(2, "No key available with this passphrase."),
		commandtest.Expect("cryptsetup", "resize", name).Reads(""),
		commandtest.Expect("cryptsetup", "open", "--test-passphrase", "--type", "luks2", "--key-file=-", dev).Reads("wrong").
			Exits(2, "No key available with this passphrase."),
		commandtest.Expect("cryptsetup", "luksRemoveKey", "--key-file=-", dev).Reads("wrong").
			Exits(2, "No key available with this passphrase."),
		commandtest.Expect("cryptsetup", "close", name).Exits(5, "Device "+name+" is still in use."),
		commandtest.Expect("cryptsetup", "close", name).Exits(5, "Device "+name+" is still in use."),
		commandtest.Expect("cryptsetup", "close", name).Exits(5, "Device "+name+" is still in use."),
		commandtest.Expect("cryptsetup", "close", name).Exits(5, "Device "+name+" is still in use."),
		commandtest.Expect("cryptsetup", "close", name).Exits(5, "Device "+name+" is still in use."),
		commandtest.Expect("cryptsetup", "close", name).Exits(5, "Device "+name+" is still in use."),
		commandtest.Expect("cryptsetup", "close", name),
		commandtest.Expect("cryptsetup", "close", name).Exits(4, "Device "+name+" is not active."),
	)
	ctx := context.Background()
	if err := d.LUKSFormat(ctx, dev, testPassphrase); err != nil {
		t.Fatal(err)
	}
	if err := d.LUKSOpen(ctx, dev, name, testPassphrase, false); err != nil {
		t.Fatal(err)
	}
	err := d.LUKSOpen(ctx, dev, name, []byte("wrong"), true)
	wantKind(t, err, errdefs.ErrPrecondition, "does not open the LUKS header on "+dev, "No key available")
	if err := d.LUKSResize(ctx, name); err != nil {
		t.Fatal(err)
	}
	if ok, err := d.LUKSTestKey(ctx, dev, []byte("wrong")); ok || err != nil {
		t.Fatalf("LUKSTestKey(wrong) = %t, %v", ok, err)
	}
	wantKind(t, d.LUKSRemoveKey(ctx, dev, []byte("wrong")), errdefs.ErrNotFound, "no keyslot")
	// Busy on every try: refused; busy once, then closed; not open: fine.
	wantKind(t, d.LUKSClose(ctx, name), errdefs.ErrPrecondition, "still in use")
	if err := d.LUKSClose(ctx, name); err != nil {
		t.Fatalf("closing a mapping busy for a moment: %v", err)
	}
	if err := d.LUKSClose(ctx, name); err != nil {
		t.Fatalf("closing a mapping that is not open: %v", err)
	}
	for _, line := range script.Ran() {
		if strings.Contains(line, key) {
			t.Fatalf("a command line holds the passphrase: %s", line)
		}
	}
}

// The key operations a rotation uses, with the real cryptsetup on a LUKS2
// header in a regular file (no device mapper needed): the added key is
// handed over in a private file that is gone afterwards.
func TestLUKSKeyslotsWithRealCryptsetup(t *testing.T) {
	testutil.RequireCommands(t, "cryptsetup")
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // where LUKSAddKey makes its private directory
	img := filepath.Join(tmp, "image")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 32<<20); err != nil {
		t.Fatal(err)
	}
	d, ran := realHost()
	ctx := context.Background()
	newKey := []byte("fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210")
	if err := d.LUKSFormat(ctx, img, testPassphrase); err != nil {
		t.Fatal(err)
	}
	sig, err := d.Probe(ctx, img)
	if err != nil || sig.Type != "crypto_LUKS" || sig.Usage != "crypto" {
		t.Fatalf("blkid of a fresh header: %+v, %v", sig, err)
	}
	wantKind(t, d.LUKSAddKey(ctx, img, newKey, newKey), errdefs.ErrPrecondition, "current key does not open")
	if err := d.LUKSAddKey(ctx, img, testPassphrase, newKey); err != nil {
		t.Fatal(err)
	}
	for _, k := range [][]byte{testPassphrase, newKey} {
		if ok, err := d.LUKSTestKey(ctx, img, k); !ok || err != nil {
			t.Fatalf("LUKSTestKey after adding = %t, %v", ok, err)
		}
	}
	if err := d.LUKSRemoveKey(ctx, img, testPassphrase); err != nil {
		t.Fatal(err)
	}
	if ok, err := d.LUKSTestKey(ctx, img, testPassphrase); ok || err != nil {
		t.Fatalf("the removed key still opens: %t, %v", ok, err)
	}
	if ok, err := d.LUKSTestKey(ctx, img, newKey); !ok || err != nil {
		t.Fatalf("the new key does not open: %t, %v", ok, err)
	}
	left, _ := filepath.Glob(filepath.Join(tmp, "spindle-key-*"))
	if len(left) != 0 {
		t.Fatalf("key files left behind: %v", left)
	}
	for _, line := range ran.all() {
		if strings.Contains(line, string(testPassphrase)) || strings.Contains(line, string(newKey)) {
			t.Fatalf("a command line holds a key: %s", line)
		}
	}
}

// This machine's kernel has no device mapper: an encrypted volume is
// refused with FAILED_PRECONDITION naming the kernel module. On a kernel
// that has one there is nothing to show.
func TestCryptAvailableNamesTheModule(t *testing.T) {
	if deviceMapperPresent("/proc/misc") {
		t.Skip("this kernel has a device mapper; the refusal is for kernels without one")
	}
	d, _ := realHost()
	err := d.CryptAvailable(context.Background())
	t.Logf("this node answers: %v", err)
	wantKind(t, err, errdefs.ErrPrecondition, "no device mapper", "dm_crypt", "dm_mod")
	if !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatal(err)
	}
}
