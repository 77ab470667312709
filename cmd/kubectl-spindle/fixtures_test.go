package main

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/spindle-csi/spindle/internal/opsapi"
)

const testDriver = "spindle.csi.dev"

// now is the fixed "now" of every test.
var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }

func pv(name, handle, claimNS, claim string) *corev1.PersistentVolume {
	p := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: testDriver, VolumeHandle: handle,
			}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
	if claim != "" {
		p.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: claimNS, Name: claim}
	}
	return p
}

func pvc(ns, name, volume string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.PersistentVolumeClaimSpec{VolumeName: volume},
		Status:     corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound},
	}
}

// va is a VolumeAttachment of the driver; change sets its state.
func va(pvName, nodeName string, change func(*storagev1.VolumeAttachment)) *storagev1.VolumeAttachment {
	v := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("csi-%s-%s", pvName, nodeName), CreationTimestamp: ago(time.Hour)},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: testDriver, NodeName: nodeName,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName},
		},
	}
	if change != nil {
		change(v)
	}
	return v
}

func attached(v *storagev1.VolumeAttachment) {
	v.Status.Attached = true
	v.Status.AttachmentMetadata = map[string]string{"imagePath": "/pool/" + *v.Spec.Source.PersistentVolumeName + ".img"}
}

func readyNode(name string, ready bool) *corev1.Node {
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionUnknown
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}},
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}},
		},
	}
}

func csiNode(name string) *storagev1.CSINode {
	return &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: testDriver, NodeID: name}}},
	}
}

func pod(ns, name, nodeName, claim string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{NodeName: nodeName, Volumes: []corev1.Volume{{
			Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}},
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// fakeNodes answers /volumes from a map; a missing node is unreachable.
type fakeNodes map[string]*opsapi.NodeVolumes

func (f fakeNodes) NodeVolumes(_ context.Context, n *corev1.Node) (*opsapi.NodeVolumes, error) {
	nv, ok := f[n.Name]
	if !ok {
		return nil, fmt.Errorf("GET http://%s:9808/volumes: connection refused", n.Name)
	}
	return nv, nil
}

type fakeController struct {
	images *opsapi.Images
	err    error
}

func (f fakeController) Images(context.Context) (*opsapi.Images, error) { return f.images, f.err }

func objects(objs ...runtime.Object) []runtime.Object { return objs }
