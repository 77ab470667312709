// Package iscsi runs csi-sanity against the driver configured with the
// iSCSI backend on a real tgtd, attaching with the userspace initiator
// (qemu-storage-daemon + FUSE + loop), with CHAP secrets on every call.
package iscsi

import (
	"path/filepath"
	"testing"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/sanity"
	"github.com/spindle-csi/spindle/internal/backend/iscsi"
	"github.com/spindle-csi/spindle/internal/backend/iscsi/iscsitest"
)

func TestSanityISCSI(t *testing.T) {
	tgtd := iscsitest.StartTgtd(t)
	cfg := tgtd.Config(t, filepath.Join(harness.TempDir(t), "pool"))
	iscsitest.CheckNoLeaks(t, cfg.StateDir)
	sanity.Run(t, sanity.Config{
		AccessType:    "mount",
		Backend:       "iscsi",
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
	tgtd := iscsitest.StartTgtd(t)
	cfg := tgtd.Config(t, filepath.Join(harness.TempDir(t), "pool"))
	iscsitest.CheckNoLeaks(t, cfg.StateDir)
	drv := harness.Start(t, harness.Options{Config: iscsitest.YAML("stock", cfg)})
	for _, access := range []string{"mount", "block"} {
		t.Run(access, func(t *testing.T) {
			sanity.RunStock(t, csiSanity, sanity.StockConfig{Socket: drv.Socket, AccessType: access, Backend: "iscsi", Secrets: map[string]string{
				iscsi.SecretUser:     "spindle-stock",
				iscsi.SecretPassword: "stock-chap-secret-1",
			}})
		})
	}
}
