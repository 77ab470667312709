//go:build cgo && ceph

// Package rbd runs csi-sanity against the driver configured with the RBD
// backend on a real single-node Ceph cluster (internal/backend/rbd/rbdtest),
// mapping with rbd-fuse + loop devices, or the mounter rbdtest.EnvMounter
// selects.
package rbd

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/sanity"
	"github.com/spindle-csi/spindle/internal/backend/rbd/rbdtest"
)

func TestMain(m *testing.M) { os.Exit(rbdtest.Main(m)) }

// TestSanityRBD runs with mount access, or the one sanity.EnvAccess names.
func TestSanityRBD(t *testing.T) {
	cl := rbdtest.Require(t)
	t.Cleanup(func() {
		if err := cl.Wipe(context.Background()); err != nil {
			t.Errorf("empty the pool: %v", err)
		}
	})
	sanity.Run(t, sanity.Config{
		AccessType:        sanity.AccessFromEnv(t),
		Backend:           "rbd",
		Mode:              cl.Mounter,
		Instance:          "rbd/ceph-test",
		BackendConfig:     cl.DriverConfig(filepath.Join(harness.TempDir(t), "fuse")),
		Secrets:           cl.Secrets(),
		MutableParameters: map[string]string{"mapOptions": "noudev"},
		ControllerAddress: os.Getenv(sanity.EnvController),
	})
}

// The stock csi-sanity binary with its default flags (its own IDs, 10 GiB
// volumes) and the cluster's secrets file. It is long (csi-sanity's
// 10 GiB volumes; docs/testing.md has the time), so it has its own make
// target instead of a place in make test.
func TestStockSanityRBD(t *testing.T) {
	if os.Getenv("SPINDLE_STOCK_SANITY_RBD") == "" {
		t.Skip("the stock csi-sanity run against RBD is long and runs with SPINDLE_STOCK_SANITY_RBD=1: make sanity-stock-rbd")
	}
	csiSanity := sanity.StockBinary(t)
	cl := rbdtest.Require(t)
	t.Cleanup(func() {
		if err := cl.Wipe(context.Background()); err != nil {
			t.Errorf("empty the pool: %v", err)
		}
	})
	controller := os.Getenv(sanity.EnvController)
	// Both services here even with a controller elsewhere: see sanity.Run.
	drv := harness.Start(t, harness.Options{Config: cl.DriverConfig(filepath.Join(harness.TempDir(t), "fuse"))})
	for _, access := range []string{"mount", "block"} {
		t.Run(access, func(t *testing.T) {
			sanity.RunStock(t, csiSanity, sanity.StockConfig{Socket: drv.Socket, AccessType: access, Backend: "rbd", Mode: cl.Mounter, Secrets: cl.Secrets(),
				ControllerEndpoint: controller})
		})
	}
}
