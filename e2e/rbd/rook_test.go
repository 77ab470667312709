//go:build cgo && ceph

package rbd

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
	"github.com/spindle-csi/spindle/internal/backend/rbd/rbdtest"
)

// What a Rook user brings: images made outside Spindle, named by a
// PersistentVolume in ceph-csi's static form, and ceph-csi's cluster map
// (Rook's rook-ceph-csi-config ConfigMap, a file kubelet rewrites in place
// when Rook moves a monitor). Both through the whole driver, on a real
// Ceph.

// imageMeta lists pool/image's metadata keys.
func imageMeta(ctx context.Context, t *testing.T, cl *rbdtest.Cluster, image string) map[string]string {
	t.Helper()
	out, err := cl.RBD(ctx, "image-meta", "list", "--format", "json", cl.Pool+"/"+image)
	if err != nil {
		t.Fatal(err)
	}
	meta := map[string]string{}
	if len(strings.TrimSpace(string(out))) > 0 {
		if err := json.Unmarshal(out, &meta); err != nil {
			t.Fatalf("image-meta list %s: %v: %q", image, err, out)
		}
	}
	return meta
}

// fsBytes is the size of the filesystem mounted at path.
func fsBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks) * st.Bsize
}

// TestPreProvisionedVolume: an image made with the rbd CLI, named as
// ceph-csi's static PVs name one (volumeHandle = the image's name,
// volumeAttributes clusterID, pool, staticVolume "true", imageFeatures),
// is published, staged (formatted once, since it is blank), mounted and
// written; after "rbd resize" it grows on the node; DeleteVolume of its
// handle deletes nothing, and Spindle never wrote a record into it.
func TestPreProvisionedVolume(t *testing.T) {
	cl := rbdtest.Require(t)
	t.Cleanup(func() {
		if err := cl.Wipe(context.Background()); err != nil {
			t.Errorf("empty the pool: %v", err)
		}
	})
	ctx := context.Background()
	const image = "static-db"
	if _, err := cl.RBD(ctx, "create", "--size", "128M", "--image-feature", "layering", cl.Pool+"/"+image); err != nil {
		t.Fatal(err)
	}
	drv := harness.Start(t, harness.Options{Config: cl.DriverConfig(filepath.Join(harness.TempDir(t), "fuse")), NodeID: "node-a"})
	c := &lifecycle.Client{Driver: drv, NodeID: "node-a", Secrets: cl.Secrets()}
	dir := harness.TempDir(t)
	v := &lifecycle.Volume{
		ID: image, CapacityBytes: 128 << 20, Capability: lifecycle.MountCapability("ext4"), StagingPath: filepath.Join(dir, "staging"),
		VolumeContext: map[string]string{"clusterID": "test", "pool": cl.Pool, "staticVolume": "true", "imageFeatures": "layering"},
	}
	target := filepath.Join(dir, "pod")
	up := func() {
		t.Helper()
		for _, step := range []func() error{
			func() error { return c.ControllerPublish(ctx, v) },
			func() error { return c.Stage(ctx, v) },
			func() error { return c.Publish(ctx, v, target, false) },
		} {
			if err := step(); err != nil {
				t.Fatal(err)
			}
		}
	}
	down := func() {
		t.Helper()
		for _, step := range []func() error{
			func() error { return c.Unpublish(ctx, v, target) },
			func() error { return c.Unstage(ctx, v) },
			func() error { return c.ControllerUnpublish(ctx, v) },
		} {
			if err := step(); err != nil {
				t.Fatal(err)
			}
		}
	}
	up()
	if v.PublishContext["image"] != image || v.PublishContext["pool"] != cl.Pool {
		t.Fatalf("publish_context %v does not name %s/%s", v.PublishContext, cl.Pool, image)
	}
	if err := writeRecords(filepath.Join(target, "wal"), records); err != nil {
		t.Fatalf("workload: %v", err)
	}
	before := fsBytes(t, target)
	down()

	// The owner grows the image outside Kubernetes; the node grows the
	// filesystem (kubelet's NodeExpandVolume after a PV resize).
	if _, err := cl.RBD(ctx, "resize", "--size", "256M", cl.Pool+"/"+image); err != nil {
		t.Fatal(err)
	}
	v.CapacityBytes = 256 << 20
	up()
	size, err := c.NodeExpand(ctx, v, target)
	if err != nil {
		t.Fatal(err)
	}
	after := fsBytes(t, target)
	if size < 256<<20 || after <= before+100<<20 {
		t.Fatalf("after rbd resize to 256 MiB and NodeExpandVolume: the node reports %d bytes, the filesystem %d (was %d)", size, after, before)
	}
	if err := checkRecords(filepath.Join(target, "wal"), records); err != nil {
		t.Fatalf("records after the expansion: %v", err)
	}
	down()

	// DeleteVolume of the handle (a PV with reclaim policy Delete) deletes
	// nothing: the image is not Spindle's.
	if err := c.Delete(ctx, v); err != nil {
		t.Fatalf("DeleteVolume %s: %v", image, err)
	}
	if _, err := cl.RBD(ctx, "info", cl.Pool+"/"+image); err != nil {
		t.Fatalf("the pre-provisioned image is gone after DeleteVolume: %v", err)
	}
	if meta := imageMeta(ctx, t, cl, image); len(meta) != 0 {
		t.Fatalf("Spindle wrote into the pre-provisioned image's metadata: %v", meta)
	}
	t.Logf("pre-provisioned %s/%s: %d records written and read back; ext4 %d -> %d bytes after rbd resize 128M -> 256M; kept after DeleteVolume, no metadata", cl.Pool, image, records, before, after)
}

// retryAborted retries call while it is ABORTED: the call before it
// failed at the client's deadline, and the driver may still be stopping
// the command that call started, holding the volume's lock.
func retryAborted(call func() error) error {
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		err := call()
		if status.Code(err) != codes.Aborted || time.Now().After(deadline) {
			return err
		}
	}
}

// TestClusterMapFollowedLive: the driver reaches its cluster only through
// ceph-csi's cluster map. The map is rewritten in place while the driver
// runs, as kubelet rewrites Rook's ConfigMap when Rook moves a monitor:
// the next call of the controller and of the node uses the monitors the
// map lists now. The map names first an address where no monitor listens
// (calls fail), then the monitor's msgr1 address, then its msgr2 address
// (another address of the same Ceph), then no monitor again and the
// monitor again; the one driver process never restarts. (It starts with
// the map naming the monitor's msgr1 address.)
func TestClusterMapFollowedLive(t *testing.T) {
	cl := rbdtest.Require(t)
	if cl.MonitorV1 == "" {
		t.Skipf("the cluster of %s has no known msgr1 address: moving the monitor needs two addresses of it", rbdtest.EnvCephDir)
	}
	t.Cleanup(func() {
		if err := cl.Wipe(context.Background()); err != nil {
			t.Errorf("empty the pool: %v", err)
		}
	})
	ctx := context.Background()
	dir := harness.TempDir(t)
	mapFile := filepath.Join(dir, "config.json")
	// Rook's ConfigMap as Rook writes it; only the monitors change.
	writeMap := func(monitor string) {
		t.Helper()
		m := fmt.Sprintf(`[{"clusterID":"rook-ceph","monitors":[%q],"namespace":"rook-ceph","cephFS":{"netNamespaceFilePath":"","subvolumeGroup":"","kernelMountOptions":"","fuseMountOptions":""},"rbd":{"netNamespaceFilePath":"","radosNamespace":""},"nfs":{"netNamespaceFilePath":""},"readAffinity":{"enabled":false,"crushLocationLabels":null}}]`, monitor)
		// In place, as kubelet swaps a ConfigMap volume's ..data link:
		// a new file renamed over the old one.
		tmp := mapFile + ".new"
		if err := os.WriteFile(tmp, []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, mapFile); err != nil {
			t.Fatal(err)
		}
	}
	// No monitor listens on port 1. The driver starts with the map naming
	// the monitor (its start-up upkeep reaches the cluster).
	const nowhere = "127.0.0.1:1"
	writeMap(cl.MonitorV1)
	config := fmt.Sprintf(`defaultBackend: rbd/rook
backends:
  - type: rbd
    name: rook
    rbd:
      clusterID: rook-ceph
      clusterMap: %s
      pool: %s
      userID: %s
      keyFile: %s
      mounter: %s
      fuseDir: %s
`, mapFile, cl.Pool, cl.User, cl.KeyFile, cl.Mounter, filepath.Join(dir, "fuse"))
	drv := harness.Start(t, harness.Options{Config: config, NodeID: "node-a"})
	// Rook's StorageClass parameters; the node stage secret is ceph-csi's
	// older adminID/adminKey pair.
	params := map[string]string{"clusterID": "rook-ceph", "pool": cl.Pool, "imageFormat": "2", "imageFeatures": "layering", "csi.storage.k8s.io/fstype": "ext4"}
	c := &lifecycle.Client{Driver: drv, NodeID: "node-a", Secrets: map[string]string{"adminID": cl.User, "adminKey": cl.Key}}
	// The driver's answer, not the client's own deadline: its Ceph client
	// gives up connecting at the per-call limit (30 s) and says that no
	// monitor of the map answered.
	failsThere := func(what string, call func(context.Context) error) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 45*time.Second)
		defer cancel()
		err := call(cctx)
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "no monitor of "+nowhere+" answered") {
			t.Fatalf("%s with the map naming %s (no monitor): %v; want UNAVAILABLE naming the monitor that did not answer", what, nowhere, err)
		}
	}
	staging := filepath.Join(dir, "staging")
	writeMap(nowhere)
	failsThere("CreateVolume", func(ctx context.Context) error {
		_, err := c.Create(ctx, "pvc-moved-mon", 64<<20, lifecycle.MountCapability(""), params, staging)
		return err
	})

	writeMap(cl.MonitorV1)
	var v *lifecycle.Volume
	err := retryAborted(func() (err error) {
		v, err = c.Create(ctx, "pvc-moved-mon", 64<<20, lifecycle.MountCapability(""), params, staging)
		return err
	})
	if err != nil {
		t.Fatalf("CreateVolume after the map was rewritten to %s: %v", cl.MonitorV1, err)
	}
	t.Cleanup(func() { _ = c.Delete(ctx, v) })
	if v.VolumeContext["clusterID"] != "rook-ceph" || !strings.HasPrefix(v.ID, "rbd/rook/"+cl.Pool+"/") {
		t.Fatalf("volume %s, context %v", v.ID, v.VolumeContext)
	}
	// kubelet stages with the PV's fsType, which the provisioner took
	// from csi.storage.k8s.io/fstype.
	v.Capability = lifecycle.MountCapability("ext4")
	target := filepath.Join(dir, "pod")
	for _, step := range []func() error{
		func() error { return c.ControllerPublish(ctx, v) },
		func() error { return c.Stage(ctx, v) },
		func() error { return c.Publish(ctx, v, target, false) },
		func() error { return writeRecords(filepath.Join(target, "wal"), records) },
		func() error { return c.Unpublish(ctx, v, target) },
		func() error { return c.Unstage(ctx, v) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}

	// The node reads the map too, not the monitors the controller put
	// in the publish_context: with the map naming no monitor, its stage
	// fails (and leaves nothing: the next one succeeds).
	writeMap(nowhere)
	failsThere("NodeStageVolume", func(ctx context.Context) error { return c.Stage(ctx, v) })

	// The monitor "moves" to its msgr2 address.
	moved := "v2:" + cl.Monitor
	writeMap(moved)
	for _, step := range []func() error{
		func() error { return retryAborted(func() error { return c.Stage(ctx, v) }) },
		func() error { return c.Publish(ctx, v, target, false) },
		func() error { return checkRecords(filepath.Join(target, "wal"), records) },
		func() error { return c.Unpublish(ctx, v, target) },
		func() error { return c.Unstage(ctx, v) },
		func() error { return c.ControllerUnpublish(ctx, v) },
	} {
		if err := step(); err != nil {
			t.Fatalf("after the map was rewritten to %s: %v", moved, err)
		}
	}

	writeMap(nowhere)
	failsThere("DeleteVolume", func(ctx context.Context) error { return c.Delete(ctx, v) })
	writeMap(moved)
	if err := retryAborted(func() error { return c.Delete(ctx, v) }); err != nil {
		t.Fatalf("DeleteVolume with the map naming %s again: %v", moved, err)
	}
	if images, err := cl.Artifacts(ctx); err != nil || len(images) != 0 {
		t.Fatalf("the pool holds %v after the delete (%v)", images, err)
	}
	t.Logf("one driver process: the map named %s (calls failed), %s (create, stage, write), %s (stage, read back, delete), with no restart", nowhere, cl.MonitorV1, moved)
}
