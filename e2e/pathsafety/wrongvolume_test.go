//go:build root

package pathsafety

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/spindle-csi/spindle/e2e/lifecycle"
)

// nodeState is what a node request could change for the volumes below the
// root: the mounts there (point, source, options), the loop devices bound
// to the pool's files, and the stage records with their content.
func nodeState(t *testing.T, w *world) string {
	t.Helper()
	var lines []string
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mountinfo), "\n") {
		f := strings.Fields(line)
		if len(f) > 9 && strings.HasPrefix(f[4], w.root) {
			sep := strings.Index(line, " - ")
			lines = append(lines, "mount "+f[4]+" "+f[5]+" "+line[sep:])
		}
	}
	blocks, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, b := range blocks {
		data, err := os.ReadFile(b)
		if err == nil && strings.HasPrefix(string(data), w.drv.PoolDir) {
			lines = append(lines, "device "+filepath.Base(filepath.Dir(filepath.Dir(b)))+" -> "+strings.TrimSpace(string(data)))
		}
	}
	_ = filepath.WalkDir(w.root, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".spindle-stage.json") {
			data, _ := os.ReadFile(p)
			lines = append(lines, "record "+p+" "+string(data))
		}
		if err == nil && d.IsDir() && p != w.root {
			var st, parent unix.Stat_t
			if unix.Lstat(p, &st) == nil && unix.Lstat(filepath.Dir(p), &parent) == nil && st.Dev != parent.Dev {
				return filepath.SkipDir // a mount: its content is the volume's
			}
		}
		return nil
	})
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestRequestsActOnlyOnTheVolumeTheyName: with filesystem volumes A and B
// and block volume C staged and published on real devices, every node
// request that names one volume and a path of another (its staging path
// or its target), or a volume that does not exist, is refused with the
// code the spec asks, naming whose the path is, and leaves every mount,
// device and stage record as it was.
func TestRequestsActOnlyOnTheVolumeTheyName(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	a, c := w.fsVol, w.blockVol
	aTarget := w.fsTarget
	b, err := w.client.Create(ctx, "pvc-paths-b", 64<<20, lifecycle.MountCapability("ext4"), nil, filepath.Join(w.root, "staging", "b", "globalmount"))
	if err != nil {
		t.Fatal(err)
	}
	bTarget := filepath.Join(w.root, "pods", "b-owner", "mount")
	cTarget := filepath.Join(w.root, "pods", "c-owner", "dev")
	if err := os.MkdirAll(filepath.Dir(b.StagingPath), 0o750); err != nil {
		t.Fatal(err)
	}
	for _, step := range []func() error{
		func() error { return w.client.ControllerPublish(ctx, b) },
		func() error { return w.client.Stage(ctx, b) },
		func() error { return w.client.Publish(ctx, b, bTarget, false) },
		func() error { return w.client.Publish(ctx, c, cTarget, false) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = w.client.Unpublish(ctx, c, cTarget)
		_ = w.client.Unpublish(ctx, b, bTarget)
		if err := w.client.Unstage(ctx, b); err != nil {
			t.Errorf("unstage %s: %v", b.ID, err)
		}
		_ = w.client.ControllerUnpublish(ctx, b)
		_ = w.client.Delete(ctx, b)
	})
	fresh := func() string {
		return filepath.Join(w.root, "pods", fmt.Sprint("fresh-", time.Now().UnixNano()), "mount")
	}
	mount := lifecycle.MountCapability("ext4")
	node := w.drv.Node
	tests := []struct {
		name string
		call func() error
		code codes.Code
		want []string
	}{
		{"unpublish B at A's target", func() error {
			_, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: b.ID, TargetPath: aTarget})
			return err
		}, codes.FailedPrecondition, []string{"volume " + a.ID}},
		{"unpublish a missing volume at A's target", func() error {
			_, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: missingVolume, TargetPath: aTarget})
			return err
		}, codes.FailedPrecondition, []string{"volume " + a.ID}},
		{"unpublish A at A's staging path", func() error {
			_, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: a.ID, TargetPath: a.StagingPath})
			return err
		}, codes.FailedPrecondition, []string{"staging path of volume " + a.ID}},
		{"unpublish B at C's target", func() error {
			_, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: b.ID, TargetPath: cTarget})
			return err
		}, codes.FailedPrecondition, []string{"volume " + c.ID}},
		{"unpublish B at C's staging path", func() error {
			_, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: b.ID, TargetPath: c.StagingPath})
			return err
		}, codes.FailedPrecondition, []string{"staging path of volume " + c.ID}},
		{"unstage a missing volume at A's staging path", func() error {
			_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: missingVolume, StagingTargetPath: a.StagingPath})
			return err
		}, codes.FailedPrecondition, []string{"volume " + a.ID}},
		{"unstage B at A's staging path", func() error {
			_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: b.ID, StagingTargetPath: a.StagingPath})
			return err
		}, codes.FailedPrecondition, []string{"volume " + a.ID, "not volume " + b.ID}},
		{"unstage B at C's staging path", func() error {
			_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: b.ID, StagingTargetPath: c.StagingPath})
			return err
		}, codes.FailedPrecondition, []string{"volume " + c.ID}},
		{"unstage B at A's target", func() error {
			_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: b.ID, StagingTargetPath: aTarget})
			return err
		}, codes.FailedPrecondition, []string{"volume " + a.ID}},
		{"stage B at A's staging path", func() error {
			_, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: b.ID, StagingTargetPath: a.StagingPath, VolumeCapability: mount, PublishContext: b.PublishContext})
			return err
		}, codes.FailedPrecondition, []string{"volume " + a.ID}},
		{"stage B at C's staging path", func() error {
			_, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: b.ID, StagingTargetPath: c.StagingPath, VolumeCapability: mount, PublishContext: b.PublishContext})
			return err
		}, codes.FailedPrecondition, []string{"volume " + c.ID}},
		{"stage B at A's target", func() error {
			_, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: b.ID, StagingTargetPath: aTarget, VolumeCapability: mount, PublishContext: b.PublishContext})
			return err
		}, codes.FailedPrecondition, []string{"volume " + a.ID}},
		{"stage a missing volume at A's staging path", func() error {
			_, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: missingVolume, StagingTargetPath: a.StagingPath, VolumeCapability: mount})
			return err
		}, codes.FailedPrecondition, []string{"volume " + a.ID}},
		{"unpublish a missing volume at A's staging path", func() error {
			_, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: missingVolume, TargetPath: a.StagingPath})
			return err
		}, codes.FailedPrecondition, []string{"staging path of volume " + a.ID}},
		{"publish a missing volume from A's staging path", func() error {
			_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: missingVolume, StagingTargetPath: a.StagingPath, TargetPath: fresh(), VolumeCapability: mount})
			return err
		}, codes.FailedPrecondition, []string{"not staged at", "volume " + a.ID}},
		{"publish B onto A's target", func() error {
			_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: b.ID, StagingTargetPath: b.StagingPath, TargetPath: aTarget, VolumeCapability: mount, PublishContext: b.PublishContext})
			return err
		}, codes.FailedPrecondition, []string{"volume " + a.ID}},
		{"publish B from A's staging path", func() error {
			_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: b.ID, StagingTargetPath: a.StagingPath, TargetPath: fresh(), VolumeCapability: mount, PublishContext: b.PublishContext})
			return err
		}, codes.FailedPrecondition, []string{"not staged at", "volume " + a.ID}},
		{"publish A onto B's target", func() error {
			_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: a.ID, StagingTargetPath: a.StagingPath, TargetPath: bTarget, VolumeCapability: mount, PublishContext: a.PublishContext})
			return err
		}, codes.FailedPrecondition, []string{"volume " + b.ID}},
		{"publish A onto B's staging path", func() error {
			_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: a.ID, StagingTargetPath: a.StagingPath, TargetPath: b.StagingPath, VolumeCapability: mount, PublishContext: a.PublishContext})
			return err
		}, codes.FailedPrecondition, []string{"staging path of volume " + b.ID}},
		{"stats of B at A's target", func() error {
			_, err := node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: b.ID, VolumePath: aTarget})
			return err
		}, codes.NotFound, []string{"not a mount of volume " + b.ID}},
		{"stats of a missing volume at C's target", func() error {
			_, err := node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: missingVolume, VolumePath: cTarget})
			return err
		}, codes.NotFound, []string{"volume " + c.ID}},
		{"expand B at A's target", func() error {
			_, err := node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: b.ID, VolumePath: aTarget})
			return err
		}, codes.NotFound, []string{"not a mount of volume " + b.ID}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := nodeState(t, w)
			err := tc.call()
			if got := codeOf(err); got != tc.code {
				t.Fatalf("code %s, want %s: %v", got, tc.code, err)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			if after := nodeState(t, w); after != before {
				t.Fatalf("a refused request changed the node:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}
