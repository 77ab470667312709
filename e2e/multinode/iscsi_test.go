//go:build cluster

package multinode

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/spindle-csi/spindle/e2e/kube"
)

// The iSCSI StorageClass and VolumeSnapshotClass the tests use
// (hack/local-cluster/multinode.sh installs them with the chart).
const (
	iscsiClass         = "spindle-iscsi"
	iscsiSnapshotClass = "spindle-iscsi"
)

// publishContextKeys are what an iSCSI node gets from ControllerPublish:
// where to log in and which LUN is the volume's, and what the node must
// know of the image. No key names a file: the node has no pool to read.
var publishContextKeys = []string{"accessType", "formatted", "fsType", "initiator", "lun", "portals", "readOnly", "serial", "targetIQN"}

// TestISCSINodeNeedsOnlyThePortal: the workers have no share of the iSCSI
// pool (the node plugins mount none, and a pod that mounts the pool's path
// from a worker's own filesystem finds no directory there), and a volume is
// still staged, written, expanded online and unstaged on a worker, from the
// publish_context (its VolumeAttachment's metadata names no file) and the
// CHAP secret alone.
func TestISCSINodeNeedsOnlyThePortal(t *testing.T) {
	c := connect(t)
	ns := c.Namespace(t)
	ctx := context.Background()
	pools := iscsiPools(t, c)
	for _, w := range []string{c.a, c.b} {
		plugin := chartPod(t, c, kube.ChartNodePlugins, w)
		for _, v := range plugin.Spec.Volumes {
			for _, p := range pools {
				if hp := v.HostPath; hp != nil && (hp.Path == p || strings.HasPrefix(p, strings.TrimSuffix(hp.Path, "/")+"/")) {
					t.Errorf("the node plugin on %s mounts the host's %s (volume %s), which holds the iSCSI pool %s", w, hp.Path, v.Name, p)
				}
			}
		}
	}
	// The pool's path on a worker itself: a hostPath of type Directory
	// there fails kubelet's check when the worker has no such directory.
	dirType := corev1.HostPathDirectory
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pool-probe", Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName: c.a, HostNetwork: true, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "probe", Image: c.PodImage, ImagePullPolicy: corev1.PullIfNotPresent, Args: []string{"pause"},
				VolumeMounts: []corev1.VolumeMount{{Name: "pool", MountPath: "/pool", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: "pool", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: pools[0], Type: &dirType}}}},
		},
	}
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, probe, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", probe.Name, err)
	}
	msg := waitEvent(t, c, ns, probe.Name, "FailedMount", "hostPath type check failed")
	t.Logf("pod %s on %s: %s", probe.Name, c.a, msg)
	if !strings.Contains(msg, pools[0]) {
		t.Errorf("FailedMount %q does not name %s", msg, pools[0])
	}
	c.DeletePod(t, ns, probe.Name)

	_, pv := c.Claim(t, ns, "grow", kube.ClaimOptions{StorageClass: iscsiClass, Size: "256Mi"})
	volumeID := pv.Spec.CSI.VolumeHandle
	// The pod waits, mounted, until its filesystem is over 400 MiB.
	c.Pod(t, ns, "grower", "grow", kube.PodOptions{Node: c.a, Args: []string{"wait-size", "/data", "419430400", "170"}})
	c.WaitPod(t, ns, "grower", corev1.PodRunning)
	va := c.Attachment(t, pv.Name, c.a, "attached", func(a *storagev1.VolumeAttachment) bool { return a.Status.Attached })
	md := va.Status.AttachmentMetadata
	t.Logf("VolumeAttachment %s on %s: attachmentMetadata %v", va.Name, c.a, md)
	if got := slices.Sorted(maps.Keys(md)); !slices.Equal(got, publishContextKeys) {
		t.Errorf("attachmentMetadata keys %v, want %v", got, publishContextKeys)
	}
	for k, v := range md {
		if strings.Contains(v, "/") {
			t.Errorf("attachmentMetadata %s=%q names a path", k, v)
		}
	}
	if want := "iqn.2026-01.dev.spindle.node:" + c.a; md["initiator"] != want || md["formatted"] != "false" || md["fsType"] != "ext4" || md["accessType"] != "mount" {
		t.Errorf("attachmentMetadata %v; want initiator %s, formatted false, fsType ext4, accessType mount", md, want)
	}
	if staged, _ := c.stagedOn(t, c.a, volumeID); len(staged) != 1 || !strings.HasPrefix(staged[0].Device, "/dev/sd") || staged[0].MountState != "mounted" {
		t.Errorf("%s's node plugin shows staged %+v, want the volume mounted once from a SCSI disk", c.a, staged)
	}

	patch := []byte(`{"spec":{"resources":{"requests":{"storage":"512Mi"}}}}`)
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, "grow", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("expand PVC: %v", err)
	}
	grower := c.WaitPod(t, ns, "grower", corev1.PodSucceeded)
	t.Logf("pod grower on %s reports %s", c.a, kube.TerminationMessage(grower))
	c.WaitFor(t, "PVC grow's capacity 512Mi", func(ctx context.Context) (bool, error) {
		got, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "grow", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		capacity := got.Status.Capacity[corev1.ResourceStorage]
		return capacity.Cmp(resource.MustParse("512Mi")) == 0, nil
	})

	c.DeletePod(t, ns, "grower")
	c.iscsiDetached(t, pv, c.a)
}

// iscsiDetached waits until the iSCSI volume of pv, whose pod on node is
// gone, has no VolumeAttachment left, and checks that node's plugin has
// nothing of it and the target's ACL nobody.
func (c *cluster) iscsiDetached(t *testing.T, pv *corev1.PersistentVolume, node string) {
	t.Helper()
	volumeID := pv.Spec.CSI.VolumeHandle
	c.WaitFor(t, "the volume detached from "+node, func(ctx context.Context) (bool, error) {
		vas, err := c.AttachmentsOf(ctx, pv.Name)
		return err == nil && len(vas) == 0, err
	})
	if staged, devices := c.stagedOn(t, node, volumeID); len(staged) != 0 || len(devices) != 0 {
		t.Errorf("after the detach %s's node plugin still has staged %+v, devices %+v", node, staged, devices)
	}
	if got := c.publishedTo(t, volumeID); len(got) != 0 {
		t.Errorf("after the detach the target's ACL for %s still has %v", volumeID, got)
	}
}

// iscsiPools are the poolDirs of the iSCSI instances in the chart's
// configuration (the controller's ConfigMap).
func iscsiPools(t *testing.T, c *cluster) []string {
	t.Helper()
	ctrl := chartPod(t, c, kube.ChartControllers, "")
	var name string
	for _, v := range ctrl.Spec.Volumes {
		if v.Name == "config" && v.ConfigMap != nil {
			name = v.ConfigMap.Name
		}
	}
	cm, err := c.Client.CoreV1().ConfigMaps(ctrl.Namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the controller's configuration (ConfigMap %q): %v", name, err)
	}
	var cfg struct {
		Backends []struct {
			Type  string `json:"type"`
			ISCSI struct {
				PoolDir string `json:"poolDir"`
			} `json:"iscsi"`
		} `json:"backends"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		t.Fatalf("ConfigMap %s: %v", name, err)
	}
	var pools []string
	for _, b := range cfg.Backends {
		if b.Type == "iscsi" && b.ISCSI.PoolDir != "" {
			pools = append(pools, filepath.Clean(b.ISCSI.PoolDir))
		}
	}
	if len(pools) == 0 {
		t.Fatalf("ConfigMap %s configures no iscsi backend", name)
	}
	return pools
}

// chartPod is the chart's running pod matching selector (on node, when
// not empty).
func chartPod(t *testing.T, c *cluster, selector, node string) *corev1.Pod {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatalf("list pods %s: %v", selector, err)
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; (node == "" || p.Spec.NodeName == node) && p.Status.Phase == corev1.PodRunning {
			return p
		}
	}
	t.Fatalf("no running pod %s on node %q", selector, node)
	return nil
}

// waitEvent waits for an event of reason on a pod whose message holds
// text, and returns the message.
func waitEvent(t *testing.T, c *cluster, ns, pod, reason, text string) string {
	t.Helper()
	var msg string
	c.WaitFor(t, fmt.Sprintf("a %s event on pod %s", reason, pod), func(ctx context.Context) (bool, error) {
		events, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == reason && strings.Contains(e.Message, text) {
				msg = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	return msg
}

// formatLines are the node plugin's "formatted volume" log lines (its
// JSON log) for volumeID on node.
func formatLines(t *testing.T, c *cluster, node, volumeID string) []string {
	t.Helper()
	plugin := chartPod(t, c, kube.ChartNodePlugins, node)
	data, err := c.Client.CoreV1().Pods(plugin.Namespace).GetLogs(plugin.Name, &corev1.PodLogOptions{Container: "spindle"}).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("log of the node plugin %s/%s: %v", plugin.Namespace, plugin.Name, err)
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		var entry struct {
			Msg      string `json:"msg"`
			VolumeID string `json:"volumeID"`
		}
		if json.Unmarshal([]byte(l), &entry) == nil && entry.Msg == "formatted volume" && entry.VolumeID == volumeID {
			out = append(out, l)
		}
	}
	return out
}

var volumeSnapshots = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}

// snapshot takes a VolumeSnapshot of claim with the iSCSI class and waits
// until it is ready to use.
func snapshot(t *testing.T, c *cluster, ns, name, claim string) {
	t.Helper()
	ctx := context.Background()
	snap := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"volumeSnapshotClassName": iscsiSnapshotClass,
			"source":                  map[string]any{"persistentVolumeClaimName": claim},
		},
	}}
	if _, err := c.Dynamic.Resource(volumeSnapshots).Namespace(ns).Create(ctx, snap, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create VolumeSnapshot %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = c.Dynamic.Resource(volumeSnapshots).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{})
	})
	c.WaitFor(t, "VolumeSnapshot "+name+" readyToUse", func(ctx context.Context) (bool, error) {
		got, err := c.Dynamic.Resource(volumeSnapshots).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ready, _, _ := unstructured.NestedBool(got.Object, "status", "readyToUse")
		return ready, nil
	})
}
