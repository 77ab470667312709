//go:build cluster

package kubernetes

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/e2e/kube"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/loop"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

const dataSize = "4194304" // 4 MiB written by the pods

// 1. A PVC is provisioned: the PV is bound, its handle is a Spindle volume
// ID (<backend>/<instance>/<image>) on the loop backend, and the controller
// lists the image under the PV's name with the claim's size.
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
	img := c.image(t, pv)
	if img == nil {
		t.Fatalf("the controller's /images has no image %s", pv.Spec.CSI.VolumeHandle)
	}
	if img.Name != pv.Name || img.Image != id.Image || img.CapacityBytes < 1<<30 || len(img.PublishedTo) != 0 {
		t.Errorf("the controller's image %+v, want name %s, image %s, at least 1 GiB, published nowhere", *img, pv.Name, id.Image)
	}
}

// 2. A pod using the claim: the VolumeAttachment is attached and its
// attachmentMetadata is the loop backend's publish_context (the image's
// path, read-write); the controller has the image published to the node; the node
// plugin staged it once on a loop device at kubelet's global mount and
// kubelet published it into the pod; what the pod wrote is in the volume,
// and a second pod reads it back.
func TestPodWritesAndASecondPodReadsBack(t *testing.T) {
	c := connect(t)
	ns := c.Namespace(t)
	_, pv := c.Claim(t, ns, "data", kube.ClaimOptions{})
	c.Pod(t, ns, "writer", "data", kube.PodOptions{Args: []string{"write", "/data/file", dataSize}})
	writer := c.WaitPod(t, ns, "writer", corev1.PodRunning)

	va := c.Attachment(t, pv.Name, c.Node, "attached", func(a *storagev1.VolumeAttachment) bool { return a.Status.Attached })
	md := va.Status.AttachmentMetadata
	if imagePath := md[loop.ContextImagePath]; len(md) != 2 || md[backend.ContextReadOnly] != "false" ||
		!filepath.IsAbs(imagePath) || filepath.Base(imagePath) != imageName(pv)+".img" {
		t.Errorf("VolumeAttachment %s attachmentMetadata = %v, want the image's path .../%s.img and read-only false", va.Name, md, imageName(pv))
	}
	if img := c.image(t, pv); img == nil || len(img.PublishedTo) != 1 || img.PublishedTo[0] != c.Node {
		t.Errorf("the controller's image of %s: %+v, want it published to %s", pv.Name, img, c.Node)
	}

	staged, devices := c.stagedOnce(t, pv, writer)
	if !strings.HasSuffix(staged.StagingPath, stagingSuffix(pv)) || staged.AccessType != "mount" || staged.FsType != "ext4" ||
		staged.MountState != "mounted" || staged.DeviceState != "attached" || !strings.HasPrefix(staged.Device, "/dev/loop") {
		t.Fatalf("the node plugin has %+v staged, want an ext4 mount of a loop device at .../%s", staged, stagingSuffix(pv))
	}
	if len(devices) != 1 || devices[0].Device != staged.Device {
		t.Fatalf("the node plugin holds %+v for %s, want only the staged device %s", devices, pv.Name, staged.Device)
	}

	wrote := strings.TrimPrefix(c.WaitLogLine(t, ns, "writer", "wrote "), "wrote ")
	if got := c.podRun(t, ns, "writer", "verify", "/data/file"); got != "verified "+wrote {
		t.Fatalf("the file in the writer's volume: %q, want verified %s", got, wrote)
	}

	c.DeletePod(t, ns, "writer")
	c.Pod(t, ns, "reader", "data", kube.PodOptions{Args: []string{"verify", "/data/file"}})
	reader := c.WaitPod(t, ns, "reader", corev1.PodSucceeded)
	if got := kube.TerminationMessage(reader); got != "verified "+wrote {
		t.Fatalf("reader says %q, want verified %s", got, wrote)
	}
}

// 3. Two pods on the node share one RWO volume: staged once, published
// twice, one device and one VolumeAttachment; formatted once: the second
// pod finds what the first wrote before it came, and each reads the
// other's file.
func TestTwoPodsShareOneVolume(t *testing.T) {
	c := connect(t)
	ns := c.Namespace(t)
	_, pv := c.Claim(t, ns, "shared", kube.ClaimOptions{})
	c.Pod(t, ns, "pod-a", "shared", kube.PodOptions{Args: []string{"write", "/data/a", "4096"}})
	a := c.WaitPod(t, ns, "pod-a", corev1.PodRunning)
	wroteA := strings.TrimPrefix(c.WaitLogLine(t, ns, "pod-a", "wrote "), "wrote ")
	c.Pod(t, ns, "pod-b", "shared", kube.PodOptions{Args: []string{"write", "/data/b", "4096"}})
	b := c.WaitPod(t, ns, "pod-b", corev1.PodRunning)
	wroteB := strings.TrimPrefix(c.WaitLogLine(t, ns, "pod-b", "wrote "), "wrote ")

	staged, devices := c.stagedOnce(t, pv, a, b)
	if len(devices) != 1 || devices[0].Device != staged.Device {
		t.Errorf("the node plugin holds %+v for %s, want only the staged device %s", devices, pv.Name, staged.Device)
	}
	// One filesystem, formatted before pod-a wrote: each pod reads the
	// other's file.
	if got := c.podRun(t, ns, "pod-b", "verify", "/data/a"); got != "verified "+wroteA {
		t.Errorf("pod-b reads pod-a's file: %q, want verified %s", got, wroteA)
	}
	if got := c.podRun(t, ns, "pod-a", "verify", "/data/b"); got != "verified "+wroteB {
		t.Errorf("pod-a reads pod-b's file: %q, want verified %s", got, wroteB)
	}
	if vas, err := c.AttachmentsOf(context.Background(), pv.Name); err != nil || len(vas) != 1 {
		t.Fatalf("VolumeAttachments of %s: %d (%v), want one", pv.Name, len(vas), err)
	}
}

// 4. volumeMode Block: the pod gets the device at its volumeDevices path
// (staged as a block volume: nothing mounted, nothing formatted), and the
// raw data, at offset 0 where a filesystem would have put its own, survives
// the volume being detached and attached again for another pod.
func TestBlockVolumeKeepsRawData(t *testing.T) {
	c := connect(t)
	ns := c.Namespace(t)
	_, pv := c.Claim(t, ns, "raw", kube.ClaimOptions{Block: true, Size: "64Mi"})
	c.Pod(t, ns, "writer", "raw", kube.PodOptions{Block: true, Args: []string{"write-block", "/dev/xvda", "1048576"}})
	writer := c.WaitPod(t, ns, "writer", corev1.PodRunning)
	c.Attachment(t, pv.Name, c.Node, "attached", func(a *storagev1.VolumeAttachment) bool { return a.Status.Attached })
	staged, devices := c.stagedOnce(t, pv, writer)
	if staged.AccessType != "block" || staged.FsType != "" || staged.MountState != "" || staged.DeviceState != "attached" ||
		!strings.HasPrefix(staged.Device, "/dev/loop") || len(devices) != 1 {
		t.Fatalf("the node plugin has %+v staged and holds %+v, want one loop device staged as a block volume", staged, devices)
	}
	wrote := strings.TrimPrefix(c.WaitLogLine(t, ns, "writer", "wrote "), "wrote ")

	c.DeletePod(t, ns, "writer")
	c.WaitFor(t, "the volume detached", func(ctx context.Context) (bool, error) {
		vas, err := c.AttachmentsOf(ctx, pv.Name)
		return err == nil && len(vas) == 0, err
	})
	if staged, devices := c.staged(t, c.Node, pv); staged != nil || len(devices) != 0 {
		t.Fatalf("after the detach the node plugin still has %+v staged and holds %+v", staged, devices)
	}
	c.Pod(t, ns, "reader", "raw", kube.PodOptions{Block: true, Args: []string{"verify-block", "/dev/xvda", "1048576"}})
	reader := c.WaitPod(t, ns, "reader", corev1.PodSucceeded)
	if got := kube.TerminationMessage(reader); got != "verified "+wrote {
		t.Fatalf("reader says %q, want verified %s", got, wrote)
	}
}

// 5. Expanding a PVC (xfs) while a pod uses it: the controller's image
// grows (ControllerExpand) and the pod sees the larger filesystem
// (NodeExpand).
func TestExpandWhileInUse(t *testing.T) {
	c := connect(t)
	c.NeedClass(t, c.XFSStorageClass, false)
	ns := c.Namespace(t)
	_, pv := c.Claim(t, ns, "grow", kube.ClaimOptions{StorageClass: c.XFSStorageClass, Size: "1Gi"})
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
	if img := c.image(t, pv); img == nil || img.CapacityBytes != 2<<30 {
		t.Errorf("the controller's image after expansion: %+v, want 2 GiB", img)
	}
}

// writeFile starts pod on claim writing dataSize bytes to /data/file,
// waits until it logs the checksum of what it wrote (through the API
// server) and returns the checksum; the pod keeps running.
func (c *cluster) writeFile(t *testing.T, ns, pod, claim string) string {
	t.Helper()
	c.Pod(t, ns, pod, claim, kube.PodOptions{Args: []string{"write", "/data/file", dataSize}})
	c.WaitPod(t, ns, pod, corev1.PodRunning)
	return strings.TrimPrefix(c.WaitLogLine(t, ns, pod, "wrote "), "wrote ")
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
	if _, err := c.Dynamic.Resource(kube.VolumeSnapshots).Namespace(ns).Create(context.Background(), snap, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create VolumeSnapshot %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = c.Dynamic.Resource(kube.VolumeSnapshots).Namespace(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	c.WaitFor(t, "VolumeSnapshot "+name+" readyToUse", func(ctx context.Context) (bool, error) {
		got, err := c.Dynamic.Resource(kube.VolumeSnapshots).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ready, _, _ := unstructured.NestedBool(got.Object, "status", "readyToUse")
		return ready, nil
	})
}

// 6. A VolumeSnapshot restored into a new claim holds the same data (not
// a fresh filesystem: the file is there).
func TestSnapshotRestoresTheData(t *testing.T) {
	c := connect(t)
	c.NeedClass(t, c.SnapshotClass, true)
	ns := c.Namespace(t)
	_, pv := c.Claim(t, ns, "origin", kube.ClaimOptions{})
	wrote := c.writeFile(t, ns, "writer", "origin")
	// A pool without reflink copies an image only while no node has it
	// attached; the snapshot is taken after the writer is gone.
	c.DeletePod(t, ns, "writer")
	c.WaitFor(t, "the volume detached", func(ctx context.Context) (bool, error) {
		vas, err := c.AttachmentsOf(ctx, pv.Name)
		return err == nil && len(vas) == 0, err
	})

	c.snapshot(t, ns, "snap", c.SnapshotClass, "origin")

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
	holder := c.WaitPod(t, ns, "holder", corev1.PodRunning)

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
	out, _ := c.spindle(t, "", "volumes", "-o", "json")
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
	table, _ := c.spindle(t, "", "volumes")
	t.Logf("$ kubectl spindle volumes\n%s", table)
	doctor, _ := c.spindle(t, "", "doctor", "--stuck-after", "0s")
	t.Logf("$ kubectl spindle doctor --stuck-after 0s\n%s", doctor)
	for _, want := range []string{va.Name, c.Node} {
		if !strings.Contains(doctor, want) {
			t.Errorf("doctor does not mention %s:\n%s", want, doctor)
		}
	}
	describe, _ := c.spindle(t, "", "describe", "exclusive", "-n", ns)
	t.Logf("$ kubectl spindle describe exclusive -n %s\n%s", ns, describe)
	staged, _ := c.stagedOnce(t, pv, holder)
	for _, want := range []string{pv.Spec.CSI.VolumeHandle, staged.StagingPath, staged.Device, "holder"} {
		if !strings.Contains(describe, want) {
			t.Errorf("describe does not show %s:\n%s", want, describe)
		}
	}
}

// 8. Teardown: deleting the pod removes the VolumeAttachment, and the
// node plugin unstages the volume and detaches its loop device; deleting
// the claim deletes the PV and the controller's image.
func TestTeardownLeavesNothing(t *testing.T) {
	c := connect(t)
	ns := c.Namespace(t)
	ctx := context.Background()
	_, pv := c.Claim(t, ns, "gone", kube.ClaimOptions{})
	c.Pod(t, ns, "user", "gone", kube.PodOptions{Args: []string{"pause"}})
	user := c.WaitPod(t, ns, "user", corev1.PodRunning)
	if _, devices := c.stagedOnce(t, pv, user); len(devices) != 1 {
		t.Fatalf("devices of the volume while in use: %+v, want one", devices)
	}

	c.DeletePod(t, ns, "user")
	c.WaitFor(t, "VolumeAttachment gone", func(ctx context.Context) (bool, error) {
		vas, err := c.AttachmentsOf(ctx, pv.Name)
		return err == nil && len(vas) == 0, err
	})
	if staged, devices := c.staged(t, c.Node, pv); staged != nil || len(devices) != 0 {
		t.Fatalf("after the pod was deleted the node plugin still has %+v staged and holds %+v", staged, devices)
	}

	if err := c.Client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.WaitFor(t, "PV deleted", func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if img := c.image(t, pv); img != nil {
		t.Fatalf("the controller still has the image after the PV was deleted: %+v", *img)
	}
}
