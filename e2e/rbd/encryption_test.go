package rbd

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
	"github.com/spindle-csi/spindle/internal/backend/rbd/rbdtest"
)

// rawImageTimeout bounds the export of one test image.
const rawImageTimeout = 5 * time.Minute

// TestEncryptedRBD: encrypted volumes on Ceph RBD through the run's mounter
// (make vmtest's luks-krbd and luks-rbd-nbd): the objects in the pool hold
// no plaintext, "rbd export" of the image shows a LUKS2 header.
func TestEncryptedRBD(t *testing.T) {
	lifecycle.RequireDMCrypt(t)
	cl := rbdtest.Require(t)
	t.Cleanup(func() {
		if err := cl.Wipe(context.Background()); err != nil {
			t.Errorf("empty the pool: %v", err)
		}
	})
	lifecycle.RunEncryption(t, lifecycle.EncryptionBackend{
		Start: func(t *testing.T, o harness.Options) *harness.Driver {
			o.Config = cl.DriverConfig(filepath.Join(harness.TempDir(t), "fuse"))
			return harness.Start(t, o)
		},
		Secrets: cl.Secrets(),
		RawImage: func(t *testing.T, _ *harness.Driver, volumeID string) []byte {
			t.Helper()
			image := volumeID[strings.LastIndexByte(volumeID, '/')+1:]
			// The whole image, through the guest's emulated network in
			// make vmtest: 320 MiB (the xfs volume) took more than rbd's
			// default minute there.
			ctx, cancel := context.WithTimeout(context.Background(), rawImageTimeout)
			defer cancel()
			data, err := cl.RBD(ctx, "export", "--no-progress", cl.Pool+"/"+image, "-")
			if err != nil {
				t.Fatal(err)
			}
			return data
		},
	})
}
