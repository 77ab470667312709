//go:build cluster

package multinode

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/spindle-csi/spindle/e2e/kube"
)

// previousTag is the driver image tag multinode.sh gives the previous
// release's build (previous-values.yaml names it).
const previousTag = "previous"

// kernelModes are the attach modes whose devices the kernel serves: a
// node plugin of any release can be replaced under them.
var kernelModes = []attachMode{modeNamed("loop"), modeNamed("iscsi-kernel"), modeNamed("krbd")}

// userspaceMode is the userspace mode the test keeps in use across the
// refused upgrade: under chart 0.1.0 its rbd-fuse runs in the node
// plugin's pod. Not rbd-nbd: 0.1.0 identifies a mapped nbd device with
// `rbd device list`, which on an emulated worker outlasted its 30 s per
// call, so 0.1.0 never staged such a volume there (run F in
// docs/results/2026-11-29-testing-history.md). Not the iSCSI userspace path: 0.1.0's image has no
// qemu-storage-daemon.
var userspaceMode = modeNamed("rbd-fuse")

// modeNamed is the attach mode of that name; a name attachModes lacks is
// a mistake in this file, caught when the package loads.
func modeNamed(name string) attachMode {
	for _, m := range attachModes {
		if m.name == name {
			return m
		}
	}
	panic("no attach mode " + name)
}

// TestUpgradeFromPreviousChart: the upgrade path from the previous release
// (chart 0.1.0 and its driver, which multinode.sh builds from that commit,
// SPINDLE_E2E_PREVIOUS_CHART and _VALUES) to this one, with volumes in use.
// The release is moved back to 0.1.0 with the values make e2e-multinode
// gave it then (the node plugin put on the host network by hand). A
// records writer per kernel attach mode (loop, kernel iSCSI, krbd) runs,
// the modes spread over both workers, staged by 0.1.0's node plugins, and
// an rbd-fuse volume is attached to worker a too (a VolumeAttachment as
// for a pod there; its rbd-fuse would run in that plugin's pod). `helm
// upgrade` to this chart is refused, naming that volume, its node and its
// mounter, and changes nothing. Once the volume is detached, as a drain
// would make it, the upgrade goes through: per kernel mode, the
// writer sees no I/O error and no gap over 5 s, its pod and
// VolumeAttachment stay, the new plugin on its node adopts the volume
// 0.1.0 staged, on the same device, and every record reads back.
func TestUpgradeFromPreviousChart(t *testing.T) {
	c := connect(t)
	h := helmRelease(t, c)
	prevChart, prevValues := os.Getenv("SPINDLE_E2E_PREVIOUS_CHART"), os.Getenv("SPINDLE_E2E_PREVIOUS_VALUES")
	if prevChart == "" || prevValues == "" {
		t.Skip("SPINDLE_E2E_PREVIOUS_CHART and SPINDLE_E2E_PREVIOUS_VALUES name the previous release's chart and values (make e2e-multinode sets them)")
	}
	if _, err := os.Stat(filepath.Join(prevChart, "Chart.yaml")); err != nil {
		t.Skipf("no previous chart (multinode.sh extracts it from the commit PREVIOUS_RELEASE, which a shallow clone lacks): %v", err)
	}
	current := h.deployedChart(t)
	// Moving the release to 0.1.0 removes the attach daemon: nothing may
	// be attached then (the earlier tests' namespaces are going).
	c.WaitForWithin(t, "no VolumeAttachment of "+kube.DriverName, 10*time.Minute, func(ctx context.Context) (bool, error) {
		vas, err := c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, a := range vas.Items {
			if a.Spec.Attacher == kube.DriverName {
				return false, nil
			}
		}
		return true, nil
	})
	t.Cleanup(func() {
		if h.deployedChart(t) != current {
			if out, err := h.upgradeTo(h.chart, h.values, "--set", "upgrade.allowUserspaceVolumeRestart=true"); err != nil {
				t.Errorf("moving the release back to %s: %v\n%s", current, err, out)
			}
		}
	})
	start := time.Now()
	if out, err := h.upgradeTo(prevChart, prevValues); err != nil {
		t.Fatalf("moving the release to the previous chart: %v\n%s", err, out)
	}
	previous := h.deployedChart(t)
	t.Logf("the release moved from %s to %s in %v", current, previous, time.Since(start).Round(time.Second))
	for _, n := range []string{c.a, c.b} {
		c.waitNodePlugin(t, "the previous release's node plugin on "+n+", ready", n, func(p *corev1.Pod) bool {
			return imageTag(containerImage(p, "spindle")) == previousTag
		})
	}
	if p := c.attachDaemonPod(t, c.a); p != nil {
		t.Fatalf("the previous release has no attach daemon, yet pod %s runs on %s", p.Name, c.a)
	}

	c.everyModeThrough(t, kernelModes, func(t *testing.T, begin func()) map[string]*corev1.Pod {
		old := map[string]*corev1.Pod{}
		for _, n := range c.workers() {
			old[n] = c.nodePlugin(t, n)
		}
		// The refusal reads the VolumeAttachments: an rbd-fuse volume
		// attached to worker a is in use there. The attachment is made by
		// hand, as the attach-detach controller makes one for a pod: with
		// a pod, 0.1.0's node plugin would stage the volume inside this
		// window, which on an emulated worker ran past kubelet's 2
		// minutes (docs/results/2026-11-29-testing-history.md, run G), and another volume's stage
		// there paused the loop writer for seconds (runs M and N). The
		// chart's check reads the same VolumeAttachment either way.
		ns := c.Namespace(t)
		_, pv := c.Claim(t, ns, "data", kube.ClaimOptions{StorageClass: userspaceMode.class, Size: "256Mi"})
		volumeID := pv.Spec.CSI.VolumeHandle
		vaName := clusterObjectName("spindle-e2e-in-use-", ns)
		pvName := pv.Name
		ctx := context.Background()
		if _, err := c.Client.StorageV1().VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: vaName},
			Spec: storagev1.VolumeAttachmentSpec{Attacher: kube.DriverName, NodeName: c.a, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}}},
			metav1.CreateOptions{}); err != nil {
			t.Fatalf("create VolumeAttachment %s: %v", vaName, err)
		}
		t.Cleanup(func() { _ = c.Client.StorageV1().VolumeAttachments().Delete(ctx, vaName, metav1.DeleteOptions{}) })
		va := c.Attachment(t, pv.Name, c.a, "attached", func(a *storagev1.VolumeAttachment) bool { return a.Status.Attached })
		if got := va.Status.AttachmentMetadata["mounter"]; got != "rbd-fuse" {
			t.Fatalf("the rbd-fuse volume's VolumeAttachment names mounter %q in its metadata, want rbd-fuse", got)
		}
		out, err := h.upgradeTo(h.chart, h.values)
		if err == nil {
			t.Fatalf("helm upgrade from %s went through with the rbd-fuse volume %s in use on %s, served by the old node plugin's pod (its pod's I/O fails now)", previous, volumeID, c.a)
		}
		msg := string(out)
		t.Logf("helm upgrade with an rbd-fuse volume in use: %s", strings.TrimSpace(msg))
		for _, want := range []string{"refusing to upgrade", volumeID + " on node " + c.a + " (rbd-fuse)", "kubectl drain"} {
			if !strings.Contains(msg, want) {
				t.Errorf("the refused upgrade's message does not say %q", want)
			}
		}
		if got := h.deployedChart(t); got != previous {
			t.Errorf("after the refused upgrade the release runs %s, want %s still", got, previous)
		}
		if now := c.nodePlugin(t, c.a); now.UID != old[c.a].UID {
			t.Errorf("the refused upgrade replaced the node plugin pod on %s", c.a)
		}
		// The volume leaves the node, as a drain would make it.
		if err := c.Client.StorageV1().VolumeAttachments().Delete(ctx, vaName, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete VolumeAttachment %s: %v", vaName, err)
		}
		c.WaitForWithin(t, "the rbd-fuse volume to be detached from "+c.a, writerStartTimeout, func(ctx context.Context) (bool, error) {
			vas, err := c.AttachmentsOf(ctx, pv.Name)
			return len(vas) == 0, err
		})

		// The writers' gaps count from here: the refused upgrade above
		// changed nothing on the nodes, and in run O the loop writer
		// paused 17 s in that phase, before this upgrade began, with
		// nothing done on its worker (docs/results/2026-11-29-testing-history.md).
		begin()
		start := time.Now()
		if out, err := h.upgradeTo(h.chart, h.values); err != nil {
			t.Fatalf("helm upgrade from %s with only kernel-attached volumes in use: %v\n%s", previous, err, out)
		}
		t.Logf("helm upgrade from %s to %s took %v", previous, h.deployedChart(t), time.Since(start).Round(time.Second))
		plugins := c.newNodePlugins(t, old)
		for n, plugin := range plugins {
			if tag := imageTag(containerImage(plugin, "spindle")); tag == previousTag {
				t.Errorf("the node plugin on %s runs tag %q after the upgrade", n, tag)
			}
			if c.attachDaemonPod(t, n) == nil {
				t.Errorf("no attach daemon pod on %s after the upgrade to this chart", n)
			}
		}
		return plugins
	})
}
