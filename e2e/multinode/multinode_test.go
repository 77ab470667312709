//go:build cluster

// Package multinode holds Spindle's end-to-end tests that need more than one
// node with a kubelet: volumes that move between nodes, a volume that must
// never be on two nodes at once, a node that is lost. `make e2e-multinode`
// (hack/local-cluster/multinode.sh) runs them on the local cluster with two
// worker nodes that are qemu guests with Debian's own kernel, so krbd and
// the iSCSI kernel initiator attach for real; Spindle is installed from the
// chart (controller on this machine's node, node plugin on the workers).
//
// The tests see the nodes only through the API server (VolumeAttachments,
// pod logs, the node plugins' /volumes and the controller's /images through
// the pod proxy), so they run unchanged on any cluster with two workers and
// the StorageClasses spindle-rbd, spindle-rbd-encrypted (encrypted: "true",
// the built-in KMS's Secret as the node-stage Secret) and spindle-iscsi and
// the VolumeSnapshotClass spindle-iscsi; the restart and upgrade tests
// (restart_test.go) also use spindle-loop, spindle-rbd-nbd,
// spindle-rbd-fuse and spindle-iscsi-userspace, and skip a mode whose
// class is missing:
//
//	SPINDLE_E2E_CLUSTER_DIR  a directory with admin.kubeconfig
//	SPINDLE_E2E_WORKERS      the two worker nodes' names, space-separated
//	SPINDLE_HELM, SPINDLE_E2E_CHART, SPINDLE_E2E_HELM_VALUES
//	                         helm, the chart and the values of release
//	                         spindle in kube-system (TestHelmUpgradeKeepsIO)
//	SPINDLE_E2E_PREVIOUS_CHART, SPINDLE_E2E_PREVIOUS_VALUES
//	                         the previous release's chart and values, its
//	                         driver image tagged "previous"
//	                         (TestUpgradeFromPreviousChart)
//
// Without them the tests skip, saying so.
package multinode

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/spindle-csi/spindle/e2e/kube"
	"github.com/spindle-csi/spindle/internal/opsapi"
)

// dataSize is what the writers write: big enough to span many blocks.
const dataSize = "4194304"

// cluster is the cluster with its two workers, a and b.
type cluster struct {
	*kube.Cluster
	a, b string
}

// clusterObjectName names a cluster-scoped object a test makes for its
// namespace ns (prefix+ns, cut to a DNS label's 63 characters).
func clusterObjectName(prefix, ns string) string {
	name := prefix + ns
	if len(name) > 63 {
		name = name[:63]
	}
	return name
}

// workers are the two worker nodes, a first.
func (c *cluster) workers() []string { return []string{c.a, c.b} }

func connect(t *testing.T) *cluster {
	t.Helper()
	workers := strings.Fields(os.Getenv("SPINDLE_E2E_WORKERS"))
	if len(workers) != 2 {
		t.Skipf("SPINDLE_E2E_WORKERS=%q: want two worker nodes (make e2e-multinode sets it)", os.Getenv("SPINDLE_E2E_WORKERS"))
	}
	c := &cluster{Cluster: kube.Connect(t, workers[0]), a: workers[0], b: workers[1]}
	for _, n := range workers {
		node, err := c.Client.CoreV1().Nodes().Get(context.Background(), n, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("worker %s: %v", n, err)
		}
		if node.Spec.Unschedulable {
			t.Fatalf("worker %s is cordoned (a previous run's leftover?)", n)
		}
	}
	return c
}

// stagedOn returns what node's plugin reports for the volume: staged, and
// the devices it has attached for it.
func (c *cluster) stagedOn(t *testing.T, node, volumeID string) (staged []opsapi.StagedVolume, devices []opsapi.AttachedDevice) {
	t.Helper()
	v := c.NodeVolumes(t, node)
	for _, s := range v.Staged {
		if s.VolumeID == volumeID {
			staged = append(staged, s)
		}
	}
	for _, d := range v.Devices {
		if d.VolumeID == volumeID {
			devices = append(devices, d)
		}
	}
	return staged, devices
}

// publishedTo is the controller's view of which nodes may attach the
// volume: for iSCSI, the initiators in the target's ACL.
func (c *cluster) publishedTo(t *testing.T, volumeID string) []string {
	t.Helper()
	for _, b := range c.ControllerImages(t).Backends {
		for _, img := range b.Images {
			if img.VolumeID == volumeID {
				return img.PublishedTo
			}
		}
	}
	t.Fatalf("the controller's /images does not list %s", volumeID)
	return nil
}

// TestRWOVolumeNeverOnTwoNodes: pods on both workers claim one
// ReadWriteOnce RBD volume. Exactly one runs; the attach-detach controller
// refuses the second node (Multi-Attach); a VolumeAttachment for the second
// node made anyway (a stale controller view) gets an attachError from the
// driver naming the holder; nothing is staged or mapped on the second node.
func TestRWOVolumeNeverOnTwoNodes(t *testing.T) {
	c := connect(t)
	ns := c.Namespace(t)
	ctx := context.Background()
	_, pv := c.Claim(t, ns, "exclusive", kube.ClaimOptions{StorageClass: "spindle-rbd", Size: "256Mi"})
	volumeID := pv.Spec.CSI.VolumeHandle
	c.Pod(t, ns, "holder", "exclusive", kube.PodOptions{Node: c.a, Args: []string{"write", "/data/file", dataSize}})
	c.WaitPod(t, ns, "holder", corev1.PodRunning)
	c.WaitLogLine(t, ns, "holder", "wrote ")

	c.Pod(t, ns, "intruder", "exclusive", kube.PodOptions{Node: c.b, Args: []string{"pause"}})
	t.Logf("event on pod intruder on %s: %s", c.b, c.WaitMultiAttach(t, ns, "intruder"))

	// A VolumeAttachment for the second node, as a controller with a stale
	// view would write it: the driver refuses it and names the holder.
	staleVA := clusterObjectName("spindle-e2e-stale-", ns)
	pvName := pv.Name
	stale := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: staleVA}, Spec: storagev1.VolumeAttachmentSpec{
		Attacher: kube.DriverName, NodeName: c.b, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}}}
	if _, err := c.Client.StorageV1().VolumeAttachments().Create(ctx, stale, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create VolumeAttachment %s: %v", staleVA, err)
	}
	t.Cleanup(func() { _ = c.Client.StorageV1().VolumeAttachments().Delete(ctx, staleVA, metav1.DeleteOptions{}) })
	va := c.Attachment(t, pv.Name, c.b, "with an attachError", func(a *storagev1.VolumeAttachment) bool { return a.Status.AttachError != nil })
	msg := va.Status.AttachError.Message
	t.Logf("VolumeAttachment %s on %s: attachError: %s", va.Name, c.b, msg)
	if va.Status.Attached {
		t.Errorf("the VolumeAttachment on %s says attached", c.b)
	}
	for _, want := range []string{"FailedPrecondition", `"` + c.a + `"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("attachError %q does not mention %s", msg, want)
		}
	}

	// Exactly one pod runs, and the volume is on one node only.
	if p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "intruder", metav1.GetOptions{}); err != nil || p.Status.Phase == corev1.PodRunning {
		t.Errorf("pod intruder on %s: phase %v (%v), want it not running", c.b, p.Status.Phase, err)
	}
	if p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "holder", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning {
		t.Errorf("pod holder on %s is not running any more (%v)", c.a, err)
	}
	if staged, devices := c.stagedOn(t, c.b, volumeID); len(staged) != 0 || len(devices) != 0 {
		t.Errorf("%s's node plugin has the volume: staged %+v, devices %+v", c.b, staged, devices)
	}
	if staged, _ := c.stagedOn(t, c.a, volumeID); len(staged) != 1 || !strings.HasPrefix(staged[0].Device, "/dev/rbd") || staged[0].MountState != "mounted" {
		t.Errorf("%s's node plugin shows staged %+v; want it staged and mounted once, on a /dev/rbd device (krbd)", c.a, staged)
	}
	if got := c.publishedTo(t, volumeID); !slices.Equal(got, []string{c.a}) {
		t.Errorf("the controller has %s published to %v, want only %s", volumeID, got, c.a)
	}
}

// TestISCSIVolumeMovesBetweenNodes: kernel iSCSI, with CHAP. A pod on
// worker a writes; it is deleted and a pod on worker b reads the same data
// back. Worker a's initiator leaves the target's ACL when the volume leaves
// it. The workers share no storage with the target host: worker a formatted
// the volume, and the controller, which learned it from the image, tells
// worker b not to. A restore of the volume's snapshot, staged on worker b,
// is not formatted either and holds the data.
func TestISCSIVolumeMovesBetweenNodes(t *testing.T) {
	c := connect(t)
	ns := c.Namespace(t)
	_, pv := c.Claim(t, ns, "data", kube.ClaimOptions{StorageClass: iscsiClass, Size: "256Mi"})
	volumeID := pv.Spec.CSI.VolumeHandle
	c.Pod(t, ns, "writer", "data", kube.PodOptions{Node: c.a, Args: []string{"write", "/data/file", dataSize}})
	c.WaitPod(t, ns, "writer", corev1.PodRunning)
	wrote := strings.TrimPrefix(c.WaitLogLine(t, ns, "writer", "wrote "), "wrote ")
	if staged, _ := c.stagedOn(t, c.a, volumeID); len(staged) != 1 || !strings.HasPrefix(staged[0].Device, "/dev/sd") {
		t.Errorf("%s's node plugin shows staged %+v, want the volume staged once on a SCSI disk (/dev/sd*: the kernel initiator)", c.a, staged)
	}
	if got := c.publishedTo(t, volumeID); !slices.Equal(got, []string{c.a}) {
		t.Errorf("the target's ACL for %s: %v, want only %s", volumeID, got, c.a)
	}
	if n := len(formatLines(t, c, c.a, volumeID)); n != 1 {
		t.Errorf("%s's node plugin logged %d \"formatted volume\" lines for the new volume %s, want 1", c.a, n, volumeID)
	}

	c.DeletePod(t, ns, "writer")
	c.iscsiDetached(t, pv, c.a)
	// The pool cannot reflink (this machine's /var/tmp): its snapshots copy
	// an image while no node has it attached.
	snapshot(t, c, ns, "data-snap", "data")

	c.Pod(t, ns, "reader", "data", kube.PodOptions{Node: c.b, Args: []string{"verify", "/data/file"}})
	va := c.Attachment(t, pv.Name, c.b, "attached", func(a *storagev1.VolumeAttachment) bool { return a.Status.Attached })
	if got := va.Status.AttachmentMetadata["formatted"]; got != "true" {
		t.Errorf("VolumeAttachment %s on %s: formatted=%q, want true (the controller saw the filesystem %s made)", va.Name, c.b, got, c.a)
	}
	reader := c.WaitPod(t, ns, "reader", corev1.PodSucceeded)
	if got := kube.TerminationMessage(reader); got != "verified "+wrote {
		t.Fatalf("the reader on %s says %q, want verified %s", c.b, got, wrote)
	}
	if got := c.publishedTo(t, volumeID); !slices.Equal(got, []string{c.b}) && len(got) != 0 {
		t.Errorf("the target's ACL for %s: %v, want only %s (or nobody, once the reader's volume detached)", volumeID, got, c.b)
	}
	if lines := formatLines(t, c, c.b, volumeID); len(lines) != 0 {
		t.Errorf("%s's node plugin formatted the moved volume: %v", c.b, lines)
	}

	group := "snapshot.storage.k8s.io"
	_, restored := c.Claim(t, ns, "restored", kube.ClaimOptions{StorageClass: iscsiClass, Size: "256Mi",
		DataSource: &corev1.TypedLocalObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "data-snap"}})
	restoredID := restored.Spec.CSI.VolumeHandle
	c.Pod(t, ns, "restored-reader", "restored", kube.PodOptions{Node: c.b, Args: []string{"verify", "/data/file"}})
	rva := c.Attachment(t, restored.Name, c.b, "attached", func(a *storagev1.VolumeAttachment) bool { return a.Status.Attached })
	if got := rva.Status.AttachmentMetadata["formatted"]; got != "true" {
		t.Errorf("VolumeAttachment %s of the restore on %s: formatted=%q, want true (a copy is never formatted)", rva.Name, c.b, got)
	}
	rreader := c.WaitPod(t, ns, "restored-reader", corev1.PodSucceeded)
	if got := kube.TerminationMessage(rreader); got != "verified "+wrote {
		t.Fatalf("the reader of the restore on %s says %q, want verified %s", c.b, got, wrote)
	}
	if lines := formatLines(t, c, c.b, restoredID); len(lines) != 0 {
		t.Errorf("%s's node plugin formatted the restored volume %s: %v", c.b, restoredID, lines)
	}
}
