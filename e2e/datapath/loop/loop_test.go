//go:build root

// Package loop measures the loop backend's data path (e2e/datapath): an
// ext4 volume published from a pool on this machine's filesystem, with the
// loop device in direct I/O (the default) and through the page cache
// (directIO: "false"), against the same fio jobs on a file beside the pool.
package loop

import (
	"path/filepath"
	"testing"

	"github.com/spindle-csi/spindle/e2e/datapath"
	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
	"github.com/spindle-csi/spindle/internal/backend/loop"
)

// BenchmarkDataPathLoop measures each mode once, whatever b.N is: its runs
// and medians are its own (datapath.Compare).
func BenchmarkDataPathLoop(b *testing.B) {
	datapath.Require(b)
	s := datapath.SettingsFromEnv(b)
	modes := []struct {
		name    string
		mutable map[string]string
	}{
		{"loop/direct-io", nil},
		{"loop/buffered", map[string]string{loop.MutableParamDirectIO: "false"}},
	}
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			pool := filepath.Join(harness.TempDir(b), "pool")
			drv := harness.Start(b, harness.Options{PoolDir: pool})
			c := lifecycle.NewClient(drv, nil)
			target := datapath.Published(b, drv, c, "datapath", s, m.mutable)
			datapath.Compare(b, m.name, s, datapath.FileSide("volume", target), datapath.FileSide("backing", datapath.BackingDir(b, pool)))
			if m.mutable == nil {
				datapath.CompareEncrypted(b, m.name, s, drv, c, target)
			}
		})
	}
}
