//go:build root

package lifecycle_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
	"github.com/spindle-csi/spindle/internal/backend/iscsi"
	"github.com/spindle-csi/spindle/internal/backend/iscsi/iscsitest"
)

// filePoolImage reads a volume's image file from a file pool (loop, iSCSI).
func filePoolImage(pool string) func(*testing.T, *harness.Driver, string) []byte {
	return func(t *testing.T, _ *harness.Driver, volumeID string) []byte {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(pool, volumeID[strings.LastIndexByte(volumeID, '/')+1:]+".img"))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
}

// TestEncrypted: encrypted volumes of the loop backend on this kernel's
// dm-crypt (make vmtest's luks-loop; this machine's kernel has none, and
// the test says so).
func TestEncrypted(t *testing.T) {
	lifecycle.RequireDMCrypt(t)
	pool := filepath.Join(harness.TempDir(t), "pool")
	lifecycle.RunEncryption(t, lifecycle.EncryptionBackend{
		Start: func(t *testing.T, o harness.Options) *harness.Driver {
			o.PoolDir = pool
			return harness.Start(t, o)
		},
		RawImage: filePoolImage(pool),
	})
}

// TestEncryptedISCSI: the same over iSCSI (make vmtest's luks-tgt and
// luks-lio: the kernel initiator against tgtd or LIO); the image the
// target stores holds no plaintext.
func TestEncryptedISCSI(t *testing.T) {
	lifecycle.RequireDMCrypt(t)
	target := iscsitest.StartTarget(t)
	pool := filepath.Join(harness.TempDir(t), "pool")
	cfg := target.Config(t, pool)
	iscsitest.CheckNoLeaks(t, cfg.StateDir)
	lifecycle.RunEncryption(t, lifecycle.EncryptionBackend{
		Start: func(t *testing.T, o harness.Options) *harness.Driver {
			o.PoolDir, o.Config = pool, iscsitest.YAML("luks", cfg)
			return harness.Start(t, o)
		},
		Secrets:  map[string]string{iscsi.SecretUser: "spindle-luks", iscsi.SecretPassword: "luks-chap-secret-1"},
		RawImage: filePoolImage(pool),
	})
}
