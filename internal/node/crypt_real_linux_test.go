//go:build root

package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

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
