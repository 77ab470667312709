//go:build cgo && ceph

package rbd

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
	"github.com/spindle-csi/spindle/internal/backend/rbd/rbdtest"
)

// rawImageTimeout bounds the export of one test image: 320 MiB (the xfs
// volume) took more than a minute in make vmtest's emulated guest.
const rawImageTimeout = 5 * time.Minute

// exportImage is "rbd export" of the whole image, run by this machine's
// own rbd. In make vmtest's guest the rbd on PATH is hack/vm/cephproxy's
// stand-in, which would bring the export from the host as one JSON
// message, about twice the image in the guest's 2 GiB; without
// SPINDLE_CEPH_PROXY in its environment the stand-in runs the guest's own
// rbd, which streams the image from the OSDs.
func exportImage(cl *rbdtest.Cluster, image string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), rawImageTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "rbd", "export", "--no-progress", cl.Pool+"/"+image, "-", "-c", cl.Conf)
	cmd.Env = []string{"LC_ALL=C"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SPINDLE_CEPH_PROXY=") && !strings.HasPrefix(kv, "LC_ALL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("rbd export %s/%s: %w: %s", cl.Pool, image, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

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
			data, err := exportImage(cl, volumeID[strings.LastIndexByte(volumeID, '/')+1:])
			if err != nil {
				t.Fatal(err)
			}
			return data
		},
	})
}
