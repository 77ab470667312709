//go:build root

// Package ops_test checks the operators' endpoints of a real driver (the
// e2e harness, real loop devices and filesystems): /metrics through a
// volume's lifecycle, /healthz when the backend goes away, and the node's
// /volumes inventory against what the kernel really holds.
package ops_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
	"github.com/spindle-csi/spindle/internal/opsapi"
	"github.com/spindle-csi/spindle/internal/testutil"
)

const mib = 1 << 20

// stagingPath is where kubelet, with its root at the driver's --kubelet-dir,
// stages a filesystem PV: plugins/kubernetes.io/csi/<driver>/<sha256(pv)>/globalmount.
func stagingPath(drv *harness.Driver, pv string) string {
	sum := sha256.Sum256([]byte(pv))
	return filepath.Join(drv.KubeletDir, "plugins/kubernetes.io/csi/spindle.csi.dev", hex.EncodeToString(sum[:]), "globalmount")
}

// blockStagingPath is kubelet's staging path of a block PV.
func blockStagingPath(drv *harness.Driver, pv string) string {
	return filepath.Join(drv.KubeletDir, "plugins/kubernetes.io/csi/volumeDevices/staging", pv)
}

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// scrape reads /metrics as Prometheus would.
func scrape(t *testing.T, drv *harness.Driver) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := get(t, drv.MetricsURL+opsapi.PathMetrics)
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value is a counter's or gauge's value, or a histogram's sample count, of
// the series of family name with exactly these labels; -1 when there is none.
func value(fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	fam, ok := fams[name]
	if !ok {
		return -1
	}
	for _, m := range fam.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		match := true
		for _, l := range m.GetLabel() {
			if labels[l.GetName()] != l.GetValue() {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return -1
}

func nodeVolumes(t *testing.T, drv *harness.Driver) opsapi.NodeVolumes {
	t.Helper()
	code, body := get(t, drv.MetricsURL+opsapi.PathVolumes)
	if code != http.StatusOK {
		t.Fatalf("GET /volumes: %d %s", code, body)
	}
	var nv opsapi.NodeVolumes
	if err := json.Unmarshal(body, &nv); err != nil {
		t.Fatalf("GET /volumes: %v\n%s", err, body)
	}
	return nv
}

// TestMetricsThroughALifecycle takes one ext4 volume through create,
// controller publish, stage, publish, unpublish, unstage, controller
// unpublish and delete, plus one refused RPC, and checks what /metrics says
// at each point that matters.
func TestMetricsThroughALifecycle(t *testing.T) {
	testutil.RequireCommands(t, "mkfs.ext4")
	drv := harness.Start(t, harness.Options{Metrics: true})
	ctx := context.Background()
	c := lifecycle.NewClient(drv, nil)
	backend := map[string]string{"backend": "loop/default"}

	fams := scrape(t, drv)
	if v := value(fams, "spindle_volumes_staged", backend); v != 0 {
		t.Errorf("before anything: spindle_volumes_staged = %v, want 0", v)
	}

	vol, err := c.Create(ctx, "pvc-metrics", 64*mib, lifecycle.MountCapability("ext4"), nil, stagingPath(drv, "pvc-metrics"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ControllerPublish(ctx, vol); err != nil {
		t.Fatal(err)
	}
	if err := c.Stage(ctx, vol); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(harness.TempDir(t), "pod", "mount")
	if err := c.Publish(ctx, vol, target, false); err != nil {
		t.Fatal(err)
	}
	// A refused RPC: a malformed volume ID.
	_, err = drv.Node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "not-an-id", StagingTargetPath: "/x", VolumeCapability: vol.Capability})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("NodeStageVolume of a bad ID: %v, want InvalidArgument", err)
	}

	fams = scrape(t, drv)
	if v := value(fams, "spindle_volumes_staged", backend); v != 1 {
		t.Errorf("staged: spindle_volumes_staged = %v, want 1", v)
	}
	if v := value(fams, "spindle_volumes_attached", backend); v != 1 {
		t.Errorf("staged: spindle_volumes_attached = %v, want 1", v)
	}
	if v := value(fams, "spindle_format_operations_total", map[string]string{"fs_type": "ext4", "result": "success"}); v != 1 {
		t.Errorf("spindle_format_operations_total{ext4,success} = %v, want 1", v)
	}
	if v := value(fams, "spindle_rpc_errors_total", map[string]string{"method": "NodeStageVolume", "reason": "invalid_argument"}); v != 1 {
		t.Errorf("spindle_rpc_errors_total{NodeStageVolume,invalid_argument} = %v, want 1", v)
	}
	if v := value(fams, "spindle_rpc_duration_seconds", map[string]string{"method": "NodeStageVolume", "code": "InvalidArgument"}); v != 1 {
		t.Errorf("spindle_rpc_duration_seconds{NodeStageVolume,InvalidArgument} count = %v, want 1", v)
	}
	if v := value(fams, "spindle_command_duration_seconds", map[string]string{"command": "mkfs.ext4", "exit_code": "0"}); v != 1 {
		t.Errorf("spindle_command_duration_seconds{mkfs.ext4,0} count = %v, want 1", v)
	}
	if v := value(fams, "spindle_command_duration_seconds", map[string]string{"command": "losetup", "exit_code": "0"}); v < 1 {
		t.Errorf("spindle_command_duration_seconds{losetup,0} count = %v, want at least the attach", v)
	}

	if err := c.Unpublish(ctx, vol, target); err != nil {
		t.Fatal(err)
	}
	if err := c.Unstage(ctx, vol); err != nil {
		t.Fatal(err)
	}
	fams = scrape(t, drv)
	if v := value(fams, "spindle_volumes_staged", backend); v != 0 {
		t.Errorf("unstaged: spindle_volumes_staged = %v, want 0", v)
	}
	if v := value(fams, "spindle_volumes_attached", backend); v != 0 {
		t.Errorf("unstaged: spindle_volumes_attached = %v, want 0", v)
	}
	if err := c.ControllerUnpublish(ctx, vol); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, vol); err != nil {
		t.Fatal(err)
	}

	fams = scrape(t, drv)
	for _, method := range []string{
		"CreateVolume", "ControllerPublishVolume", "NodeStageVolume", "NodePublishVolume",
		"NodeUnpublishVolume", "NodeUnstageVolume", "ControllerUnpublishVolume", "DeleteVolume",
	} {
		if v := value(fams, "spindle_rpc_duration_seconds", map[string]string{"method": method, "code": "OK"}); v != 1 {
			t.Errorf("spindle_rpc_duration_seconds{%s,OK} count = %v, want 1", method, v)
		}
	}
	if v := value(fams, "spindle_format_operations_total", map[string]string{"fs_type": "ext4", "result": "success"}); v != 1 {
		t.Errorf("after the lifecycle: spindle_format_operations_total{ext4,success} = %v, want still 1", v)
	}
}

// TestHealthzFailsWhenThePoolIsGone: /healthz is the Probe RPC's answer
// over HTTP, 503 with the reason while the pool directory is missing, and
// healthy again once it is back.
func TestHealthzFailsWhenThePoolIsGone(t *testing.T) {
	drv := harness.Start(t, harness.Options{Metrics: true})
	if code, body := get(t, drv.MetricsURL+opsapi.PathHealthz); code != http.StatusOK || strings.TrimSpace(string(body)) != "ok" {
		t.Fatalf("healthy driver: /healthz = %d %q", code, body)
	}
	moved := drv.PoolDir + ".moved"
	if err := os.Rename(drv.PoolDir, moved); err != nil {
		t.Fatal(err)
	}
	restore := func() { _ = os.Rename(moved, drv.PoolDir) }
	t.Cleanup(restore)

	code, body := get(t, drv.MetricsURL+opsapi.PathHealthz)
	if code != http.StatusServiceUnavailable {
		t.Errorf("pool gone: /healthz = %d %q, want 503", code, body)
	}
	if !strings.Contains(string(body), "loop/default") || !strings.Contains(string(body), drv.PoolDir) {
		t.Errorf("pool gone: /healthz says %q; want the backend and the pool directory named", body)
	}
	restore()
	if code, body := get(t, drv.MetricsURL+opsapi.PathHealthz); code != http.StatusOK {
		t.Errorf("pool back: /healthz = %d %q, want 200", code, body)
	}
}

// TestNodeVolumesShowsWhatIsStaged stages a filesystem volume (published
// into a pod path) and a block volume, and checks /volumes against the
// kernel's view; then the filesystem volume's staging mount vanishes behind
// the driver's back, and /volumes says so.
func TestNodeVolumesShowsWhatIsStaged(t *testing.T) {
	testutil.RequireCommands(t, "mkfs.ext4")
	drv := harness.Start(t, harness.Options{Metrics: true})
	ctx := context.Background()
	c := lifecycle.NewClient(drv, nil)

	fsVol, err := c.Create(ctx, "pvc-fs", 64*mib, lifecycle.MountCapability("ext4"), nil, stagingPath(drv, "pvc-fs"))
	if err != nil {
		t.Fatal(err)
	}
	blockStaging := blockStagingPath(drv, "pvc-block")
	if err := os.MkdirAll(filepath.Dir(blockStaging), 0o750); err != nil {
		t.Fatal(err)
	}
	blockVol, err := c.Create(ctx, "pvc-block", 16*mib, lifecycle.BlockCapability(), nil, blockStaging)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []*lifecycle.Volume{fsVol, blockVol} {
		if err := c.ControllerPublish(ctx, v); err != nil {
			t.Fatal(err)
		}
		if err := c.Stage(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	target := filepath.Join(harness.TempDir(t), "pod", "mount")
	if err := c.Publish(ctx, fsVol, target, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Unpublish(ctx, fsVol, target)
		for _, v := range []*lifecycle.Volume{fsVol, blockVol} {
			if err := c.Unstage(ctx, v); err != nil {
				t.Errorf("cleanup: %v", err)
			}
			_ = c.ControllerUnpublish(ctx, v)
			_ = c.Delete(ctx, v)
		}
	})

	// The kernel's view, read without the driver: one loop device per image.
	devOf := map[string]string{}
	for _, v := range []*lifecycle.Volume{fsVol, blockVol} {
		img := v.ID[strings.LastIndex(v.ID, "/")+1:]
		devs := loopDevicesOf(t, filepath.Join(drv.PoolDir, img+".img"))
		if len(devs) != 1 {
			t.Fatalf("volume %s has loop devices %v, want 1", v.ID, devs)
		}
		devOf[v.ID] = devs[0]
	}

	nv := nodeVolumes(t, drv)
	if nv.Version != opsapi.FormatVersion || nv.Node != harness.NodeID || nv.Driver != "spindle.csi.dev" || len(nv.Errors) != 0 {
		t.Errorf("/volumes header: version %d node %q driver %q errors %v", nv.Version, nv.Node, nv.Driver, nv.Errors)
	}
	if len(nv.Staged) != 2 {
		t.Fatalf("/volumes staged = %+v, want the 2 volumes", nv.Staged)
	}
	byID := map[string]opsapi.StagedVolume{}
	for _, s := range nv.Staged {
		byID[s.VolumeID] = s
	}
	fs := byID[fsVol.ID]
	want := opsapi.StagedVolume{
		VolumeID: fsVol.ID, Backend: "loop/default", Image: strings.TrimPrefix(fsVol.ID, "loop/default/"),
		Device: devOf[fsVol.ID], StagingPath: fsVol.StagingPath, AccessType: "mount", FsType: "ext4",
		MountState: opsapi.MountStateMounted, DeviceState: opsapi.DeviceStateAttached, Publishes: []string{target},
		StagedAt: fs.StagedAt,
	}
	if !equalStaged(fs, want) {
		t.Errorf("/volumes filesystem volume:\n got  %+v\n want %+v", fs, want)
	}
	if fs.StagedAt.IsZero() {
		t.Error("/volumes filesystem volume has no stagedAt")
	}
	blk := byID[blockVol.ID]
	wantBlock := opsapi.StagedVolume{
		VolumeID: blockVol.ID, Backend: "loop/default", Image: strings.TrimPrefix(blockVol.ID, "loop/default/"),
		Device: devOf[blockVol.ID], StagingPath: blockStaging, AccessType: "block",
		DeviceState: opsapi.DeviceStateAttached, StagedAt: blk.StagedAt,
	}
	if !equalStaged(blk, wantBlock) {
		t.Errorf("/volumes block volume:\n got  %+v\n want %+v", blk, wantBlock)
	}
	var devices []string
	for _, d := range nv.Devices {
		devices = append(devices, d.VolumeID+"="+d.Device)
	}
	slices.Sort(devices)
	wantDevices := []string{blockVol.ID + "=" + devOf[blockVol.ID], fsVol.ID + "=" + devOf[fsVol.ID]}
	slices.Sort(wantDevices)
	if !slices.Equal(devices, wantDevices) {
		t.Errorf("/volumes devices = %v, want %v", devices, wantDevices)
	}

	// The staging mount vanishes (an operator's umount, a node agent's
	// cleanup); the record and the device stay.
	if err := c.Unpublish(ctx, fsVol, target); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(fsVol.StagingPath, 0); err != nil {
		t.Fatal(err)
	}
	nv = nodeVolumes(t, drv)
	for _, s := range nv.Staged {
		if s.VolumeID != fsVol.ID {
			continue
		}
		if s.MountState != opsapi.MountStateMissing || s.DeviceState != opsapi.DeviceStateAttached || s.Problem == "" || len(s.Publishes) != 0 {
			t.Errorf("after the mount vanished: %+v; want mountState missing, device attached, a problem, no publishes", s)
		}
	}
}

func equalStaged(a, b opsapi.StagedVolume) bool {
	return a.VolumeID == b.VolumeID && a.Backend == b.Backend && a.Image == b.Image && a.Device == b.Device &&
		a.StagingPath == b.StagingPath && a.AccessType == b.AccessType && a.FsType == b.FsType &&
		a.ReadOnly == b.ReadOnly && a.MountState == b.MountState && a.DeviceState == b.DeviceState &&
		slices.Equal(a.Publishes, b.Publishes) && a.Problem == b.Problem && a.StagedAt.Equal(b.StagedAt)
}

// loopDevicesOf reads /sys for the loop devices bound to file.
func loopDevicesOf(t *testing.T, file string) []string {
	t.Helper()
	paths, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if strings.TrimSpace(string(b)) == file {
			out = append(out, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(p))))
		}
	}
	return out
}
