//go:build root

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
	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
	"github.com/spindle-csi/spindle/internal/backend/iscsi"
	"github.com/spindle-csi/spindle/internal/backend/iscsi/iscsitest"
	"github.com/spindle-csi/spindle/internal/config"
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

// TestISCSINodeWithoutPool: a controller (--mode=controller) on the pool
// and a node plugin (--mode=node) whose configured pool directory does not
// exist, as on a worker that shares no storage with the target host: the
// node stages, publishes, writes, expands online (xfs), unstages and stages
// again from the publish_context and the CHAP secret alone; a restore of a
// snapshot of the volume is staged without being formatted and holds the
// data. The node's pool directory never appears.
func TestISCSINodeWithoutPool(t *testing.T) {
	testutil.RequireCommands(t, "mkfs.xfs", "xfs_growfs")
	target := iscsitest.StartTarget(t)
	pool := filepath.Join(harness.TempDir(t), "pool")
	cfg := target.Config(t, pool)
	iscsitest.CheckNoLeaks(t, cfg.StateDir)
	nodeCfg := cfg
	nodeCfg.PoolDir = filepath.Join(harness.TempDir(t), "no-pool-on-this-node")
	ctrl := harness.Start(t, harness.Options{Mode: config.ModeController, PoolDir: pool, Config: iscsitest.YAML("split", cfg)})
	node := harness.Start(t, harness.Options{Mode: config.ModeNode, PoolDir: nodeCfg.PoolDir, Config: iscsitest.YAML("split", nodeCfg)})
	dir := harness.TempDir(t)
	harness.CheckNoLeaks(t, pool, dir)
	t.Cleanup(func() {
		if _, err := os.Lstat(nodeCfg.PoolDir); !os.IsNotExist(err) {
			t.Errorf("the node plugin's pool directory %s exists (%v)", nodeCfg.PoolDir, err)
		}
	})
	secrets := map[string]string{iscsi.SecretUser: "spindle-split", iscsi.SecretPassword: "split-chap-secret-1"}
	c := &lifecycle.Client{Driver: ctrl, NodeID: harness.NodeID, Secrets: secrets}
	n := &lifecycle.Client{Driver: node, NodeID: harness.NodeID, Secrets: secrets}
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// The smallest xfs mkfs.xfs makes is 300 MiB.
	const size, grown = 320 << 20, 384 << 20
	v, err := c.Create(ctx, "pvc-split", size, lifecycle.MountCapability("xfs"), nil, filepath.Join(dir, "staging"))
	must(err)
	t.Cleanup(func() { _ = c.Delete(context.WithoutCancel(ctx), v) })
	podPath := filepath.Join(dir, "pod")
	teardown := func(v *lifecycle.Volume) {
		t.Cleanup(func() {
			ctx := context.WithoutCancel(ctx)
			_ = n.Unpublish(ctx, v, podPath)
			_ = n.Unstage(ctx, v)
			_ = c.ControllerUnpublish(ctx, v)
		})
	}
	teardown(v)
	must(c.ControllerPublish(ctx, v))
	if got := v.PublishContext[iscsi.ContextFormatted]; got != "false" {
		t.Fatalf("publish_context %v: %s=%q for a new volume, want false", v.PublishContext, iscsi.ContextFormatted, got)
	}
	must(n.Stage(ctx, v))
	must(n.Publish(ctx, v, podPath, false))
	p := lifecycle.NewPayload(4 << 20)
	must(lifecycle.Write(v, podPath, p))

	fsBytes := func() int64 {
		t.Helper()
		var st unix.Statfs_t
		must(unix.Statfs(podPath, &st))
		return int64(st.Blocks) * st.Bsize
	}
	before := fsBytes()
	must(c.ControllerExpand(ctx, v, grown))
	got, err := n.NodeExpand(ctx, v, podPath)
	must(err)
	if got != grown {
		t.Fatalf("NodeExpandVolume = %d bytes, want %d", got, grown)
	}
	// xfs's statfs leaves out its internal log: compare with before.
	if after := fsBytes(); after <= before {
		t.Fatalf("the filesystem has %d bytes after the expansion, %d before", after, before)
	}

	// readBack attaches a volume the node must not format (the controller
	// says so), reads the payload and detaches it again.
	readBack := func(what string, v *lifecycle.Volume) {
		t.Helper()
		must(c.ControllerPublish(ctx, v))
		if got := v.PublishContext[iscsi.ContextFormatted]; got != "true" {
			t.Fatalf("publish_context %v of %s: %s=%q, want true", v.PublishContext, what, iscsi.ContextFormatted, got)
		}
		must(n.Stage(ctx, v))
		must(n.Publish(ctx, v, podPath, false))
		must(lifecycle.Check(v, podPath, p))
		must(n.Unpublish(ctx, v, podPath))
		must(n.Unstage(ctx, v))
		must(c.ControllerUnpublish(ctx, v))
	}
	// Unstaged and published again: the controller has seen the
	// filesystem, and the node finds the data, unformatted.
	must(n.Unpublish(ctx, v, podPath))
	must(n.Unstage(ctx, v))
	must(c.ControllerUnpublish(ctx, v))
	readBack("the volume the node formatted", v)

	// A restore of its snapshot (taken unpublished: /tmp's filesystem
	// cannot reflink) is a copy: never formatted, and it holds the data.
	snap, err := c.Snapshot(ctx, "snap-split", v)
	must(err)
	t.Cleanup(func() { _ = c.DeleteSnapshot(context.WithoutCancel(ctx), snap) })
	r, err := c.CreateFrom(ctx, "pvc-split-restored", 0, lifecycle.MountCapability("xfs"), nil, filepath.Join(dir, "staging-restored"), lifecycle.FromSnapshot(snap))
	must(err)
	t.Cleanup(func() { _ = c.Delete(context.WithoutCancel(ctx), r) })
	teardown(r)
	readBack("a restore", r)
}
