//go:build root

// Package iscsi measures the iSCSI backend's data path (e2e/datapath): an
// ext4 volume on a LUN served by a real target and attached by the mode the
// environment selects (iscsitest.ModeFromEnv: the userspace initiator
// against tgtd here; the kernel initiator in `make vmtest`'s guest), against
// the same fio jobs on a file beside the target's image files.
package iscsi

import (
	"path/filepath"
	"testing"

	"github.com/spindle-csi/spindle/e2e/datapath"
	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
	"github.com/spindle-csi/spindle/internal/backend/iscsi"
	"github.com/spindle-csi/spindle/internal/backend/iscsi/iscsitest"
)

// BenchmarkDataPathISCSI measures the mode once, whatever b.N is: its runs
// and medians are its own (datapath.Compare).
func BenchmarkDataPathISCSI(b *testing.B) {
	datapath.Require(b)
	s := datapath.SettingsFromEnv(b)
	target := iscsitest.StartTarget(b)
	pool := filepath.Join(harness.TempDir(b), "pool")
	cfg := target.Config(b, pool)
	drv := harness.Start(b, harness.Options{PoolDir: pool, Config: iscsitest.YAML("datapath", cfg)})
	c := lifecycle.NewClient(drv, nil)
	c.Secrets = map[string]string{iscsi.SecretUser: "spindle-bench", iscsi.SecretPassword: "datapath-chap-1"}
	mounted := datapath.Published(b, drv, c, "datapath", s, nil)
	mode := "iscsi/" + target.Mode.String()
	datapath.Compare(b, mode, s, datapath.FileSide("volume", mounted), datapath.FileSide("backing", datapath.BackingDir(b, pool)))
	datapath.CompareEncrypted(b, mode, s, drv, c, mounted)
}
