package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/e2e/kube"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/spindle-csi/spindle/internal/volumeid"
)

const dataSize = "4194304" // 4 MiB written by the pods

// 1. A PVC is provisioned: the PV is bound and its handle is a Spindle
// volume ID (<backend>/<instance>/<image>) on the loop backend.
func TestProvisionBindsAPVWithASpindleHandle(t *testing.T) {
	c := connect(t)
	ns := c.Namespace(t)
	_, pv := c.Claim(t, ns, "data", kube.ClaimOptions{})
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driverName {
		t.Fatalf("PV %s is not a %s volume: %+v", pv.Name, driverName, pv.Spec.PersistentVolumeSource)
	}
	id, err := volumeid.Parse(pv.Spec.CSI.VolumeHandle)
	if err != nil {
		t.Fatalf("volumeHandle %q: %v", pv.Spec.CSI.VolumeHandle, err)
	}
	if id.Backend != "loop" || id.Instance != "default" || id.Image == "" {
		t.Fatalf("volumeHandle %q, want loop/default/<image>", pv.Spec.CSI.VolumeHandle)
	}
	if pv.Spec.CSI.FSType != "ext4" {
		t.Errorf("PV fsType %q, want ext4", pv.Spec.CSI.FSType)
	}
	if got := pv.Spec.Capacity[corev1.ResourceStorage]; got.Cmp(resource.MustParse("1Gi")) < 0 {
		t.Errorf("PV capacity %s, want at least 1Gi", got.String())
	}
	if _, err := os.Stat(c.imagePath(pv)); err != nil {
		t.Errorf("the image of %s is not in the pool: %v", pv.Name, err)
	}
}

// 2. A pod using the claim: the VolumeAttachment is attached and shows the
// driver's publish_context; kubelet staged the volume at its global mount
// and published it into the pod; what the pod wrote, a second pod reads.
func TestPodWritesAndASecondPodReadsBack(t *testing.T) {
	c := connect(t)
	ns := c.Namespace(t)
	_, pv := c.Claim(t, ns, "data", kube.ClaimOptions{})
	writer := c.Pod(t, ns, "writer", "data", kube.PodOptions{Args: []string{"write", "/data/file", dataSize}})
	writer = c.WaitPod(t, ns, "writer", corev1.PodRunning)

	va := c.Attachment(t, pv.Name, c.Node, "attached", func(a *storagev1.VolumeAttachment) bool { return a.Status.Attached })
	// The same ControllerPublish again is idempotent and answers with the
	// publish_context the attacher stored.
	resp, err := c.csiClient(t).ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{
		VolumeId: pv.Spec.CSI.VolumeHandle, NodeId: c.Node,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
			// The attacher asks for ReadWriteOnce as SINGLE_NODE_MULTI_WRITER
			// (several pods of one node), which the driver supports.
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER},
		},
	})
	if err != nil {
		t.Fatalf("ControllerPublishVolume: %v", err)
	}
	if !maps.Equal(va.Status.AttachmentMetadata, resp.GetPublishContext()) {
		t.Fatalf("VolumeAttachment %s attachmentMetadata = %v, driver's publish_context = %v", va.Name, va.Status.AttachmentMetadata, resp.GetPublishContext())
	}
	if va.Status.AttachmentMetadata["imagePath"] != c.imagePath(pv) {
		t.Errorf("attachmentMetadata names image %q, want %q", va.Status.AttachmentMetadata["imagePath"], c.imagePath(pv))
	}

	staged := mountsAt(t, c.stagingPath(pv))
	if len(staged) != 1 || staged[0].fsType != "ext4" || !strings.HasPrefix(staged[0].source, "/dev/loop") {
		t.Fatalf("staging mount at %s = %+v, want one ext4 mount of a loop device", c.stagingPath(pv), staged)
	}
	if devs := loopDevicesOf(t, c.imagePath(pv)); len(devs) != 1 || devs[0] != staged[0].source {
		t.Fatalf("loop devices of the image %v, staged device %s", devs, staged[0].source)
	}
	target := c.podVolumeDir(writer, pv.Name)
	published := mountsAt(t, target)
	if len(published) != 1 || published[0].source != staged[0].source {
		t.Fatalf("pod volume %s mounts %+v, want a bind of %s", target, published, staged[0].source)
	}

	var wrote string
	c.WaitFor(t, "the writer's checksum file", func(context.Context) (bool, error) {
		data, err := os.ReadFile(filepath.Join(target, "file.sha256"))
		wrote = strings.TrimSpace(string(data))
		return err == nil && len(wrote) == 64, nil
	})
	if got := fileSum(t, filepath.Join(target, "file")); got != wrote {
		t.Fatalf("file in the pod volume has checksum %s, the pod recorded %s", got, wrote)
	}

	c.DeletePod(t, ns, "writer")
	c.Pod(t, ns, "reader", "data", kube.PodOptions{Args: []string{"verify", "/data/file"}})
	reader := c.WaitPod(t, ns, "reader", corev1.PodSucceeded)
	if got := kube.TerminationMessage(reader); got != "verified "+wrote {
		t.Fatalf("reader says %q, want verified %s", got, wrote)
	}
}

// 3. Two pods on the node share one RWO volume: formatted once, staged
// once, published twice.
func TestTwoPodsShareOneVolume(t *testing.T) {
	c := connect(t)
	ns := c.Namespace(t)
	_, pv := c.Claim(t, ns, "shared", kube.ClaimOptions{})
	a := c.Pod(t, ns, "pod-a", "shared", kube.PodOptions{Args: []string{"write", "/data/a", "4096"}})
	b := c.Pod(t, ns, "pod-b", "shared", kube.PodOptions{Args: []string{"write", "/data/b", "4096"}})
	a = c.WaitPod(t, ns, "pod-a", corev1.PodRunning)
	b = c.WaitPod(t, ns, "pod-b", corev1.PodRunning)

	handle := pv.Spec.CSI.VolumeHandle
	if n := len(c.driverLog(t, map[string]string{"msg": "formatted volume", "volumeID": handle})); n != 1 {
		t.Errorf("volume formatted %d times, want once", n)
	}
	if n := len(c.driverLog(t, map[string]string{"msg": "rpc", "method": "NodeStageVolume", "code": "OK", "volumeID": handle})); n != 1 {
		t.Errorf("NodeStageVolume succeeded %d times, want once", n)
	}
	if n := len(c.driverLog(t, map[string]string{"msg": "rpc", "method": "NodePublishVolume", "code": "OK", "volumeID": handle})); n != 2 {
		t.Errorf("NodePublishVolume succeeded %d times, want twice", n)
	}
	staged := mountsAt(t, c.stagingPath(pv))
	if len(staged) != 1 {
		t.Fatalf("staging mounts %+v, want one", staged)
	}
	for _, pod := range []*corev1.Pod{a, b} {
		if m := mountsAt(t, c.podVolumeDir(pod, pv.Name)); len(m) != 1 || m[0].source != staged[0].source {
			t.Fatalf("pod %s volume mounts %+v, want a bind of %s", pod.Name, m, staged[0].source)
		}
	}
	// Both pods write into the same filesystem.
	c.WaitFor(t, "both pods' files in the volume", func(context.Context) (bool, error) {
		_, errA := os.Stat(filepath.Join(c.stagingPath(pv), "a.sha256"))
		_, errB := os.Stat(filepath.Join(c.stagingPath(pv), "b.sha256"))
		return errA == nil && errB == nil, nil
	})
	if vas, err := c.AttachmentsOf(context.Background(), pv.Name); err != nil || len(vas) != 1 {
		t.Fatalf("VolumeAttachments of %s: %d (%v), want one", pv.Name, len(vas), err)
	}
}

// 4. volumeMode Block: the pod gets the device at its volumeDevices path,
// and raw data survives the pod being replaced.
func TestBlockVolumeKeepsRawData(t *testing.T) {
	c := connect(t)
	ns := c.Namespace(t)
	_, pv := c.Claim(t, ns, "raw", kube.ClaimOptions{Block: true, Size: "64Mi"})
	c.Pod(t, ns, "writer", "raw", kube.PodOptions{Block: true, Args: []string{"write-block", "/dev/xvda", "1048576"}})
	c.WaitPod(t, ns, "writer", corev1.PodRunning)
	c.Attachment(t, pv.Name, c.Node, "attached", func(a *storagev1.VolumeAttachment) bool { return a.Status.Attached })
	if n := len(c.driverLog(t, map[string]string{"msg": "formatted volume", "volumeID": pv.Spec.CSI.VolumeHandle})); n != 0 {
		t.Fatalf("a block volume was formatted %d times", n)
	}
	// The data reaches the image file: read it there, outside the pod.
	var onImage string
	c.WaitFor(t, "the writer's data on the image", func(context.Context) (bool, error) {
		f, err := os.Open(c.imagePath(pv))
		if err != nil {
			return false, err
		}
		defer f.Close()
		buf := make([]byte, 1048576+64)
		if _, err := f.ReadAt(buf, 0); err != nil {
			return false, err
		}
		onImage = string(buf[1048576:])
		return onImage != strings.Repeat("\x00", 64), nil
	})
	c.DeletePod(t, ns, "writer")
	c.Pod(t, ns, "reader", "raw", kube.PodOptions{Block: true, Args: []string{"verify-block", "/dev/xvda", "1048576"}})
	reader := c.WaitPod(t, ns, "reader", corev1.PodSucceeded)
	if got := kube.TerminationMessage(reader); got != "verified "+onImage {
		t.Fatalf("reader says %q, want verified %s", got, onImage)
	}
}

// 5. Expanding a PVC (xfs) while a pod uses it: ControllerExpand and
// NodeExpand run, and the pod sees the larger filesystem.
func TestExpandWhileInUse(t *testing.T) {
	c := connect(t)
	ns := c.Namespace(t)
	_, pv := c.Claim(t, ns, "grow", kube.ClaimOptions{StorageClass: "spindle-xfs", Size: "1Gi"})
	// The pod waits, mounted, until its filesystem is over 1.5 GiB.
	c.Pod(t, ns, "watcher", "grow", kube.PodOptions{Args: []string{"wait-size", "/data", "1610612736", "170"}})
	c.WaitPod(t, ns, "watcher", corev1.PodRunning)

	patch := []byte(`{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}`)
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Patch(context.Background(), "grow", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("expand PVC: %v", err)
	}
	watcher := c.WaitPod(t, ns, "watcher", corev1.PodSucceeded)
	t.Logf("pod reports %s", kube.TerminationMessage(watcher))
	c.WaitFor(t, "PVC capacity 2Gi", func(ctx context.Context) (bool, error) {
		got, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "grow", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		capacity := got.Status.Capacity[corev1.ResourceStorage]
		return capacity.Cmp(resource.MustParse("2Gi")) == 0, nil
	})
	handle := pv.Spec.CSI.VolumeHandle
	for _, method := range []string{"ControllerExpandVolume", "NodeExpandVolume"} {
		if n := len(c.driverLog(t, map[string]string{"msg": "rpc", "method": method, "code": "OK", "volumeID": handle})); n == 0 {
			t.Errorf("%s never succeeded for %s", method, handle)
		}
	}
	if st, err := os.Stat(c.imagePath(pv)); err != nil || st.Size() != 2<<30 {
		t.Errorf("image size after expansion: %v, %v; want 2 GiB", st, err)
	}
}

var volumeSnapshots = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}

// writeFile starts pod on claim (of PV pv) writing dataSize bytes to
// /data/file, waits for its checksum file and returns the checksum; the
// pod keeps running.
func (c *cluster) writeFile(t *testing.T, ns, pod, claim string, pv *corev1.PersistentVolume) string {
	t.Helper()
	c.Pod(t, ns, pod, claim, kube.PodOptions{Args: []string{"write", "/data/file", dataSize}})
	writer := c.WaitPod(t, ns, pod, corev1.PodRunning)
	var wrote string
	c.WaitFor(t, "the checksum file of "+pod, func(context.Context) (bool, error) {
		data, err := os.ReadFile(filepath.Join(c.podVolumeDir(writer, pv.Name), "file.sha256"))
		wrote = strings.TrimSpace(string(data))
		return err == nil && len(wrote) == 64, nil
	})
	return wrote
}

// snapshot takes VolumeSnapshot name of claim with class, waits until it
// is ready to use, and deletes it when the test ends.
func (c *cluster) snapshot(t *testing.T, ns, name, class, claim string) {
	t.Helper()
	snap := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"volumeSnapshotClassName": class,
			"source":                  map[string]any{"persistentVolumeClaimName": claim},
		},
	}}
	if _, err := c.Dynamic.Resource(volumeSnapshots).Namespace(ns).Create(context.Background(), snap, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create VolumeSnapshot %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = c.Dynamic.Resource(volumeSnapshots).Namespace(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
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

// 6. A VolumeSnapshot restored into a new claim holds the same data.
func TestSnapshotRestoresTheData(t *testing.T) {
	c := connect(t)
	ns := c.Namespace(t)
	_, pv := c.Claim(t, ns, "origin", kube.ClaimOptions{})
	wrote := c.writeFile(t, ns, "writer", "origin", pv)
	// A pool without reflink copies an image only while no node has it
	// attached; the snapshot is taken after the writer is gone.
	c.DeletePod(t, ns, "writer")
	c.WaitFor(t, "the volume detached", func(ctx context.Context) (bool, error) {
		vas, err := c.AttachmentsOf(ctx, pv.Name)
		return err == nil && len(vas) == 0, err
	})

	c.snapshot(t, ns, "snap", "spindle", "origin")

	group := "snapshot.storage.k8s.io"
	_, restored := c.Claim(t, ns, "restored", kube.ClaimOptions{DataSource: &corev1.TypedLocalObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "snap"}})
	if restored.Spec.CSI.VolumeHandle == pv.Spec.CSI.VolumeHandle {
		t.Fatal("the restored claim got the original volume")
	}
	c.Pod(t, ns, "reader", "restored", kube.PodOptions{Args: []string{"verify", "/data/file"}})
	reader := c.WaitPod(t, ns, "reader", corev1.PodSucceeded)
	if got := kube.TerminationMessage(reader); got != "verified "+wrote {
		t.Fatalf("reader of the restored volume says %q, want verified %s", got, wrote)
	}
	if n := len(c.driverLog(t, map[string]string{"msg": "formatted volume", "volumeID": restored.Spec.CSI.VolumeHandle})); n != 0 {
		t.Fatalf("the restored volume was formatted %d times", n)
	}
}

// 7. A pod on a second node while the first holds the RWO volume. Two
// layers refuse it, and an operator sees both:
//   - the attach-detach controller, which attaches a ReadWriteOnce (or
//     ReadWriteOncePod) volume to one node only: a Multi-Attach event on the
//     pod, and no VolumeAttachment for the second node;
//   - the driver, when a VolumeAttachment for the second node exists anyway
//     (the controller's view was stale, e.g. after it force-detached from
//     a node it believed down): ControllerPublishVolume is refused, and the
//     VolumeAttachment's status.attachError names the node that holds the
//     volume, as `kubectl get volumeattachment -o yaml` shows it.
func TestSecondNodeAttachErrorNamesTheHolder(t *testing.T) {
	c := connect(t)
	ns := c.Namespace(t)
	ctx := context.Background()
	_, pv := c.Claim(t, ns, "exclusive", kube.ClaimOptions{})
	c.Pod(t, ns, "holder", "exclusive", kube.PodOptions{Args: []string{"pause"}})
	c.WaitPod(t, ns, "holder", corev1.PodRunning)

	// A node without a kubelet: the attach-detach controller manages its
	// attachments (the annotation kubelet would set), and its CSINode maps
	// it to a driver node ID, as a registered node plugin would.
	other := "spindle-e2e-second-node"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: other, Annotations: map[string]string{
		"volumes.kubernetes.io/controller-managed-attach-detach": "true"}}}
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node %s: %v", other, err)
	}
	staleVA := "spindle-e2e-stale-attachment"
	t.Cleanup(func() {
		zero := int64(0)
		// No kubelet confirms the pod's end: delete it at once.
		_ = c.Client.CoreV1().Pods(ns).Delete(ctx, "mover", metav1.DeleteOptions{GracePeriodSeconds: &zero})
		_ = c.Client.StorageV1().VolumeAttachments().Delete(ctx, staleVA, metav1.DeleteOptions{})
		_ = c.Client.StorageV1().CSINodes().Delete(ctx, other, metav1.DeleteOptions{})
		_ = c.Client.CoreV1().Nodes().Delete(ctx, other, metav1.DeleteOptions{})
		c.WaitFor(t, "the second node's VolumeAttachment gone", func(ctx context.Context) (bool, error) {
			vas, err := c.AttachmentsOf(ctx, pv.Name)
			for _, va := range vas {
				if va.Spec.NodeName == other {
					return false, err
				}
			}
			return err == nil, err
		})
	})
	csiNode := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: other}, Spec: storagev1.CSINodeSpec{
		Drivers: []storagev1.CSINodeDriver{{Name: driverName, NodeID: other}}}}
	if _, err := c.Client.StorageV1().CSINodes().Create(ctx, csiNode, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CSINode %s: %v", other, err)
	}
	c.Pod(t, ns, "mover", "exclusive", kube.PodOptions{Node: other, Args: []string{"pause"}})
	t.Logf("event on pod mover: %s", c.WaitMultiAttach(t, ns, "mover"))
	if vas, err := c.AttachmentsOf(ctx, pv.Name); err != nil || len(vas) != 1 || vas[0].Spec.NodeName != c.Node {
		t.Fatalf("VolumeAttachments of %s: %+v (%v), want only the holder's", pv.Name, vas, err)
	}

	// The stale view: a VolumeAttachment for the second node, as the
	// attach-detach controller writes it.
	pvName := pv.Name
	stale := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: staleVA}, Spec: storagev1.VolumeAttachmentSpec{
		Attacher: driverName, NodeName: other, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}}}
	if _, err := c.Client.StorageV1().VolumeAttachments().Create(ctx, stale, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create VolumeAttachment %s: %v", staleVA, err)
	}
	va := c.Attachment(t, pv.Name, other, "with an attachError", func(a *storagev1.VolumeAttachment) bool { return a.Status.AttachError != nil })
	msg := va.Status.AttachError.Message
	t.Logf("VolumeAttachment %s attachError: %s", va.Name, msg)
	if va.Status.Attached {
		t.Fatal("the second node's VolumeAttachment says attached")
	}
	image := pv.Spec.CSI.VolumeHandle[strings.LastIndex(pv.Spec.CSI.VolumeHandle, "/")+1:]
	for _, want := range []string{"FailedPrecondition", `"` + c.Node + `"`, image} {
		if !strings.Contains(msg, want) {
			t.Errorf("attachError %q does not mention %q", msg, want)
		}
	}
	// The holder keeps the volume.
	if held := c.Attachment(t, pv.Name, c.Node, "attached", func(a *storagev1.VolumeAttachment) bool { return a.Status.Attached }); held == nil {
		t.Fatal("the holder lost its attachment")
	}

	// What an operator sees with kubectl-spindle: the attach error in
	// `volumes` and `doctor`, the node's device and staging path in `describe`.
	var rows []struct {
		PV          string `json:"pv"`
		Attachments []struct {
			Node, State, Error string
		} `json:"attachments"`
	}
	out := c.kubectlSpindle(t, "volumes", "-o", "json")
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("kubectl spindle volumes -o json: %v\n%s", err, out)
	}
	states := map[string]string{}
	for _, r := range rows {
		if r.PV != pv.Name {
			continue
		}
		for _, a := range r.Attachments {
			states[a.Node] = a.State
			if a.Node == other && !strings.Contains(a.Error, c.Node) {
				t.Errorf("volumes shows the error %q, want it to name %s", a.Error, c.Node)
			}
		}
	}
	if states[c.Node] != "attached" || states[other] != "error" {
		t.Errorf("kubectl spindle volumes shows %v for %s, want %s attached and %s error", states, pv.Name, c.Node, other)
	}
	t.Logf("$ kubectl spindle volumes\n%s", c.kubectlSpindle(t, "volumes"))
	doctor := c.kubectlSpindle(t, "doctor", "--stuck-after", "0s")
	t.Logf("$ kubectl spindle doctor --stuck-after 0s\n%s", doctor)
	for _, want := range []string{va.Name, c.Node} {
		if !strings.Contains(doctor, want) {
			t.Errorf("doctor does not mention %s:\n%s", want, doctor)
		}
	}
	describe := c.kubectlSpindle(t, "describe", "exclusive", "-n", ns)
	t.Logf("$ kubectl spindle describe exclusive -n %s\n%s", ns, describe)
	for _, want := range []string{pv.Spec.CSI.VolumeHandle, c.stagingPath(pv), "/dev/loop", "holder"} {
		if !strings.Contains(describe, want) {
			t.Errorf("describe does not show %s:\n%s", want, describe)
		}
	}
}

// kubectlSpindle runs the operators' kubectl plugin (built by `make build`)
// against the cluster, with the node plugin's endpoint this cluster serves,
// and returns its output. Doctor's exit status 1 (findings) is not an error.
func (c *cluster) kubectlSpindle(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := filepath.Abs("../../bin/kubectl-spindle")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kubectl-spindle is not built (make build): %v", err)
	}
	args = append(args, "--kubeconfig", filepath.Join(c.Dir, "admin.kubeconfig"), "--node-address", c.Node+"="+c.nodeMetricsAddress())
	cmd := exec.Command(bin, args...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1 && args[0] == "doctor") {
		t.Fatalf("kubectl-spindle %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// 8. Teardown: deleting the pod removes the VolumeAttachment and detaches
// the loop device; deleting the claim deletes the PV and the image.
func TestTeardownLeavesNothing(t *testing.T) {
	c := connect(t)
	ns := c.Namespace(t)
	ctx := context.Background()
	_, pv := c.Claim(t, ns, "gone", kube.ClaimOptions{})
	c.Pod(t, ns, "user", "gone", kube.PodOptions{Args: []string{"pause"}})
	c.WaitPod(t, ns, "user", corev1.PodRunning)
	image := c.imagePath(pv)
	if devs := loopDevicesOf(t, image); len(devs) != 1 {
		t.Fatalf("loop devices of the image while in use: %v, want one", devs)
	}

	c.DeletePod(t, ns, "user")
	c.WaitFor(t, "VolumeAttachment gone", func(ctx context.Context) (bool, error) {
		vas, err := c.AttachmentsOf(ctx, pv.Name)
		return err == nil && len(vas) == 0, err
	})
	if devs := loopDevicesOf(t, image); len(devs) != 0 {
		t.Fatalf("loop devices left after the pod was deleted: %v", devs)
	}
	if m := mountsAt(t, c.stagingPath(pv)); len(m) != 0 {
		t.Fatalf("staging mount left: %+v", m)
	}

	if err := c.Client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.WaitFor(t, "PV deleted", func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if _, err := os.Stat(image); !os.IsNotExist(err) {
		t.Fatalf("image %s after the PV was deleted: %v", image, err)
	}
}
