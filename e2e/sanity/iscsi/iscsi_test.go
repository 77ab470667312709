//go:build root

// Package iscsi runs csi-sanity against the driver configured with the
// iSCSI backend on a real target, attaching with a real initiator, with
// CHAP secrets on every call: by default tgtd and the userspace initiator
// (qemu-storage-daemon + FUSE + loop); the target and initiator the
// environment selects otherwise (iscsitest.ModeFromEnv; make vmtest).
package iscsi

import (
	"path/filepath"
	"testing"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/sanity"
	"github.com/spindle-csi/spindle/internal/backend/iscsi"
	"github.com/spindle-csi/spindle/internal/backend/iscsi/iscsitest"
)

// TestSanityISCSI runs with mount access, or the one sanity.EnvAccess names.
func TestSanityISCSI(t *testing.T) {
	target := iscsitest.StartTarget(t)
	cfg := target.Config(t, filepath.Join(harness.TempDir(t), "pool"))
	iscsitest.CheckNoLeaks(t, cfg.StateDir)
	sanity.Run(t, sanity.Config{
		AccessType:    sanity.AccessFromEnv(t),
		Backend:       "iscsi",
		Mode:          target.Mode.String(),
		Instance:      "iscsi/sanity",
		BackendConfig: iscsitest.YAML("sanity", cfg),
		Secrets: map[string]string{
			iscsi.SecretUser:     "spindle-sanity",
			iscsi.SecretPassword: "sanity-chap-secret-1",
		},
		MutableParameters: map[string]string{iscsi.MutableParamDirectIO: "false"},
	})
}

// The stock csi-sanity binary with its default flags (its own IDs, 10 GiB
// volumes) and a secrets file with the CHAP credentials.
func TestStockSanityISCSI(t *testing.T) {
	csiSanity := sanity.StockBinary(t)
	target := iscsitest.StartTarget(t)
	cfg := target.Config(t, filepath.Join(harness.TempDir(t), "pool"))
	iscsitest.CheckNoLeaks(t, cfg.StateDir)
	drv := harness.Start(t, harness.Options{Config: iscsitest.YAML("stock", cfg)})
	for _, access := range []string{"mount", "block"} {
		t.Run(access, func(t *testing.T) {
			sanity.RunStock(t, csiSanity, sanity.StockConfig{Socket: drv.Socket, AccessType: access, Backend: "iscsi", Mode: target.Mode.String(), Secrets: map[string]string{
				iscsi.SecretUser:     "spindle-stock",
				iscsi.SecretPassword: "stock-chap-secret-1",
			}})
		})
	}
}
