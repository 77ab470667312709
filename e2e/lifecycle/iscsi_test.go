package lifecycle_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
	"github.com/spindle-csi/spindle/internal/backend/iscsi"
	"github.com/spindle-csi/spindle/internal/backend/iscsi/iscsitest"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// TestFullLifecycleISCSI takes a volume through the whole lifecycle over
// the real iSCSI path: a target with an ACL and CHAP (tgtd by default),
// logged in to by a real initiator (by default the userspace one,
// qemu-storage-daemon + FUSE + loop; iscsitest.ModeFromEnv): write,
// unstage, restage, checksum. It logs how long each step took and, with
// $SPINDLE_REPORT_DIR, writes the timings there.
func TestFullLifecycleISCSI(t *testing.T) {
	tests := []struct {
		name       string
		capability *csi.VolumeCapability
		programs   []string
	}{
		{"ext4", lifecycle.MountCapability("ext4"), []string{"mkfs.ext4"}},
		{"xfs", lifecycle.MountCapability("xfs"), []string{"mkfs.xfs"}},
		{"block", lifecycle.BlockCapability(), nil},
	}
	mode, _ := iscsitest.ModeFromEnv() // a malformed mode fails in StartTarget
	var report []string
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			testutil.RequireCommands(t, tt.programs...)
			target := iscsitest.StartTarget(t)
			pool := filepath.Join(harness.TempDir(t), "pool")
			cfg := target.Config(t, pool)
			iscsitest.CheckNoLeaks(t, cfg.StateDir)
			drv := harness.Start(t, harness.Options{PoolDir: pool, Config: iscsitest.YAML("lifecycle", cfg)})
			dir := harness.TempDir(t)
			harness.CheckNoLeaks(t, drv.PoolDir, dir)

			type timing struct {
				step string
				took time.Duration
			}
			var steps []timing
			c := lifecycle.NewClient(drv, func(step, _ string, took time.Duration, err error) {
				if err == nil {
					steps = append(steps, timing{step, took})
				}
			})
			c.Secrets = map[string]string{iscsi.SecretUser: "spindle-lc", iscsi.SecretPassword: "lifecycle-chap-1"}
			start := time.Now()
			err := c.Full(context.Background(), lifecycle.Spec{
				Name: "pvc-iscsi-" + tt.name, SizeBytes: 256 << 20, Capability: tt.capability, WorkDir: dir,
				PayloadBytes: 8 << 20,
			})
			total := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			line := fmt.Sprintf("lifecycle over iSCSI (%s, CHAP), %s, 256 MiB volume, 8 MiB payload: total %s;", target.Mode, tt.name, total.Round(time.Millisecond))
			for _, s := range steps {
				names = append(names, s.step)
				line += fmt.Sprintf(" %s %s,", s.step, s.took.Round(time.Millisecond))
			}
			line = strings.TrimSuffix(line, ",")
			t.Log(line)
			report = append(report, line)
			want := []string{
				lifecycle.StepCreate, lifecycle.StepControllerPublish, lifecycle.StepStage,
				lifecycle.StepPublish, lifecycle.StepPublish, lifecycle.StepWrite, lifecycle.StepRead,
				lifecycle.StepUnpublish, lifecycle.StepUnpublish, lifecycle.StepUnstage,
				lifecycle.StepStage, lifecycle.StepPublish, lifecycle.StepRead, lifecycle.StepUnpublish,
				lifecycle.StepUnstage, lifecycle.StepControllerUnpublish, lifecycle.StepDelete,
			}
			if !slices.Equal(names, want) {
				t.Errorf("steps:\n got  %v\n want %v", names, want)
			}
			if left := poolImages(t, drv.PoolDir); len(left) > 0 {
				t.Errorf("pool still holds %v after DeleteVolume", left)
			}
			if targets := target.Targets(t); len(targets) > 0 {
				t.Errorf("the target still serves %v after ControllerUnpublishVolume", targets)
			}
		})
	}
	if dir := os.Getenv("SPINDLE_REPORT_DIR"); dir != "" && len(report) > 0 {
		_ = os.MkdirAll(dir, 0o755)
		_ = os.WriteFile(filepath.Join(dir, "lifecycle-iscsi-"+strings.ReplaceAll(mode.String(), "/", "-")+".txt"), []byte(strings.Join(report, "\n")+"\n"), 0o644)
	}
}
