//go:build root

// Package stock runs the stock csi-sanity binary, with its default flags,
// against the spindle binary as a user starts it (--mode all on a loop
// pool), in mount and in block access.
package stock

import (
	"os"
	"testing"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/sanity"
	"github.com/spindle-csi/spindle/internal/testutil"
)

func TestStockSanityLoop(t *testing.T) {
	testutil.RequireRoot(t, "bind real loop devices and mount real filesystems")
	csiSanity := sanity.StockBinary(t)
	binary := os.Getenv("SPINDLE_BINARY")
	if binary == "" {
		t.Fatal("SPINDLE_BINARY is not set: the spindle binary to test is missing (make test builds it into bin/)")
	}
	work := harness.TempDir(t)
	drv, err := harness.StartProcess(harness.ProcessOptions{
		Binary: binary, WorkDir: work,
		// csi-sanity's default directories are /tmp/csi-mount and /tmp/csi-staging.
		ExtraArgs: []string{"--allowed-path-root=" + os.TempDir()},
	})
	if err != nil {
		t.Fatal(err)
	}
	harness.CheckNoLeaks(t, drv.PoolDir, work)
	t.Cleanup(func() {
		if err := drv.Stop(); err != nil {
			t.Errorf("stop the driver: %v", err)
		}
	})
	for _, access := range []string{"mount", "block"} {
		t.Run(access, func(t *testing.T) {
			sanity.RunStock(t, csiSanity, sanity.StockConfig{Socket: drv.Socket, AccessType: access, Backend: "loop"})
		})
	}
}
