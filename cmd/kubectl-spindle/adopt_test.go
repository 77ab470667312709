package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/spindle-csi/spindle/internal/opsapi"
)

// recordingAdopter is the controller's adopt endpoint: it answers as the
// rbd backend would and records what it was asked.
type recordingAdopter struct {
	calls []opsapi.AdoptRequest
	fail  error
	// openBy, when set, says who has the image open now (nil: nobody).
	openBy func() []string
}

func (r *recordingAdopter) Adopt(_ context.Context, req opsapi.AdoptRequest) (*opsapi.AdoptedVolume, error) {
	r.calls = append(r.calls, req)
	if r.fail != nil {
		return nil, r.fail
	}
	var open []string
	if r.openBy != nil {
		open = r.openBy()
	}
	if len(open) > 0 && !req.DryRun {
		return nil, fmt.Errorf("HTTP 412: adopt replicapool/%s: the image is still open by %v (mapped on a node, or open by another client): nothing was changed", req.Attributes["imageName"], open)
	}
	return &opsapi.AdoptedVolume{VolumeID: "rbd/ceph/replicapool/" + req.Attributes["imageName"], CapacityBytes: 1 << 30,
		VolumeContext: map[string]string{"clusterID": "rook-ceph", "pool": "replicapool"}, OpenBy: open, DryRun: req.DryRun}, nil
}

// mappedWhilePodRuns is ceph-csi's mapping of the image: open by the
// node's client while the StatefulSet's pod pg-0 exists.
func mappedWhilePodRuns(kube *fake.Clientset) func() []string {
	return func() []string {
		if _, err := kube.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), "db", "pg-0"); err != nil {
			return nil
		}
		return []string{"10.0.0.7:0/3411306950"}
	}
}

// cephCSICluster is a claim of ceph-csi's driver used by a StatefulSet's
// pod, Rook's provisioner secret and a Spindle StorageClass for the same
// cluster and pool. Reactors play the controllers: scaling the StatefulSet
// to zero removes its pod and the PV's VolumeAttachment, a new claim is
// bound at once.
func cephCSICluster(t *testing.T) *fake.Clientset {
	t.Helper()
	one := int32(1)
	fs := corev1.PersistentVolumeFilesystem
	class := "rook-ceph-block-cephcsi"
	old := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pvc-1111"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      pv("x", "", "", "").Spec.Capacity,
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:                    &fs,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              class,
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "db", Name: "data"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: "rook-ceph.rbd.csi.ceph.com", VolumeHandle: "0001-0009-rook-ceph-0000000000000002-6b9f", FSType: "ext4",
				VolumeAttributes: map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "imageName": "csi-vol-6b9f", "imageFeatures": "layering", "journalPool": "replicapool"},
			}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "data", Labels: map[string]string{"app": "pg"},
			Annotations: map[string]string{"pv.kubernetes.io/bind-completed": "yes", "team": "payments"}},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, VolumeName: "pvc-1111", VolumeMode: &fs,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound},
	}
	ss := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "pg", UID: "ss-uid"}, Spec: appsv1.StatefulSetSpec{Replicas: &one}}
	p := pod("db", "pg-0", "worker-1", "data")
	p.OwnerReferences = []metav1.OwnerReference{{Kind: "StatefulSet", Name: "pg", UID: "ss-uid", Controller: ptrTo(true)}}
	attach := va("pvc-1111", "worker-1", attached)
	attach.Spec.Attacher = "rook-ceph.rbd.csi.ceph.com"
	spindleClass := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "rook-ceph-block"}, Provisioner: testDriver,
		Parameters: map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "imageFormat": "2", "imageFeatures": "layering", "csi.storage.k8s.io/fstype": "ext4",
			"csi.storage.k8s.io/provisioner-secret-name": "rook-csi-rbd-provisioner", "csi.storage.k8s.io/provisioner-secret-namespace": "rook-ceph",
			"csi.storage.k8s.io/node-stage-secret-name": "rook-csi-rbd-node", "csi.storage.k8s.io/node-stage-secret-namespace": "rook-ceph",
			"csi.storage.k8s.io/controller-expand-secret-name": "rook-csi-rbd-provisioner", "csi.storage.k8s.io/controller-expand-secret-namespace": "rook-ceph"}}
	cephcsiClass := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: class}, Provisioner: "rook-ceph.rbd.csi.ceph.com", Parameters: spindleClass.Parameters}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "rook-ceph", Name: "rook-csi-rbd-provisioner"},
		Data: map[string][]byte{"userID": []byte("csi-rbd-provisioner"), "userKey": []byte("AQBkey==")}}
	kube := fake.NewSimpleClientset(old, claim, ss, p, attach, spindleClass, cephcsiClass, secret)
	kube.PrependReactor("patch", "statefulsets", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if strings.Contains(string(action.(k8stesting.PatchAction).GetPatch()), `"replicas":0`) {
			_ = kube.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), "db", "pg-0")
			_ = kube.Tracker().Delete(storagev1.SchemeGroupVersion.WithResource("volumeattachments"), "", attach.Name)
		}
		return false, nil, nil
	})
	kube.PrependReactor("create", "persistentvolumeclaims", func(action k8stesting.Action) (bool, runtime.Object, error) {
		c := action.(k8stesting.CreateAction).GetObject().(*corev1.PersistentVolumeClaim)
		c.Status.Phase = corev1.ClaimBound
		return false, nil, nil
	})
	return kube
}

func ptrTo[T any](v T) *T { return &v }

func adoptOpts(log *bytes.Buffer, dry bool) AdoptOptions {
	o := AdoptOptions{Driver: testDriver, DryRun: dry, Timeout: 2 * time.Second, Poll: 10 * time.Millisecond}
	if log != nil {
		o.Log = log // not a nil *bytes.Buffer in the interface
	}
	return o
}

// TestAdoptDryRun: every step is printed, the controller checks the image
// (a dry run of its own), and nothing in the cluster changes.
func TestAdoptDryRun(t *testing.T) {
	kube := cephCSICluster(t)
	ctrl := &recordingAdopter{}
	var log bytes.Buffer
	a, err := Adopt(context.Background(), kube, "db", "pvc/data", ctrl, adoptOpts(&log, true))
	if err != nil {
		t.Fatalf("adopt --dry-run: %v", err)
	}
	for _, want := range []string{
		"checked: db/data (PV pvc-1111, driver rook-ceph.rbd.csi.ceph.com) is image replicapool/csi-vol-6b9f (cluster rook-ceph), which the controller adopts as volume rbd/ceph/replicapool/csi-vol-6b9f of StorageClass rook-ceph-block",
		"would record the claim and its workloads' replicas on PV pvc-1111",
		"would scale statefulset/pg from 1 to 0 replicas",
		"would wait until no pod uses claim db/data and PV pvc-1111 is attached to no node",
		"would keep PV pvc-1111 and its image when the claim goes (reclaim policy Delete -> Retain)",
		"would give image replicapool/csi-vol-6b9f (cluster rook-ceph) Spindle's records",
		"would delete claim db/data",
		"would create PV pvc-1111-spindle (driver spindle.csi.dev, volume rbd/ceph/replicapool/csi-vol-6b9f, StorageClass rook-ceph-block)",
		"would delete PV pvc-1111 (retained: its image stays)",
		"would create claim db/data (StorageClass rook-ceph-block, volumeName pvc-1111-spindle)",
		"would scale statefulset/pg back to 1 replicas",
	} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the dry run does not say %q:\n%s", want, log.String())
		}
	}
	for _, c := range ctrl.calls {
		if !c.DryRun {
			t.Fatalf("a dry run asked the controller for a real adoption: %+v", c)
		}
	}
	if len(ctrl.calls) == 0 || ctrl.calls[0].Secrets["userID"] != "csi-rbd-provisioner" || ctrl.calls[0].Name != "pvc-1111-spindle" || ctrl.calls[0].FsType != "ext4" {
		t.Fatalf("controller requests %+v", ctrl.calls)
	}
	if _, ok := ctrl.calls[0].Parameters["csi.storage.k8s.io/provisioner-secret-name"]; ok {
		t.Fatalf("the sidecars' keys went to the controller: %v", ctrl.calls[0].Parameters)
	}
	pv, _ := kube.CoreV1().PersistentVolumes().Get(context.Background(), "pvc-1111", metav1.GetOptions{})
	ss, _ := kube.AppsV1().StatefulSets("db").Get(context.Background(), "pg", metav1.GetOptions{})
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || len(pv.Annotations) != 0 || *ss.Spec.Replicas != 1 {
		t.Fatalf("the dry run changed the cluster: PV %+v, replicas %d", pv.ObjectMeta, *ss.Spec.Replicas)
	}
	if !a.DryRun || a.VolumeID != "rbd/ceph/replicapool/csi-vol-6b9f" {
		t.Fatalf("result %+v", a)
	}
}

// TestAdopt: the whole move, and the state the cluster is left in; a run
// that stopped once the old claim was gone is finished by running again.
func TestAdopt(t *testing.T) {
	for _, interrupted := range []bool{false, true} {
		t.Run(map[bool]string{false: "in one run", true: "resumed"}[interrupted], func(t *testing.T) {
			ctx := context.Background()
			kube := cephCSICluster(t)
			ctrl := &recordingAdopter{}
			if interrupted {
				failed := false
				kube.PrependReactor("create", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
					if !failed {
						failed = true
						return true, nil, errors.New("the API server went away")
					}
					return false, nil, nil
				})
			}
			var log bytes.Buffer
			_, err := Adopt(ctx, kube, "db", "pvc/data", ctrl, adoptOpts(&log, false))
			if interrupted {
				if err == nil || !strings.Contains(err.Error(), "the API server went away") {
					t.Fatalf("first run: %v", err)
				}
				if _, err := kube.CoreV1().PersistentVolumeClaims("db").Get(ctx, "data", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					t.Fatalf("the claim should be gone when the run stopped: %v", err)
				}
				_, err = Adopt(ctx, kube, "db", "pvc/data", ctrl, adoptOpts(&log, false))
				if !strings.Contains(log.String(), "resumed: claim db/data is gone, PV pvc-1111 (retained) carries the adoption") {
					t.Fatalf("the second run did not resume:\n%s", log.String())
				}
			}
			if err != nil {
				t.Fatalf("adopt: %v\n%s", err, log.String())
			}
			if _, err := kube.CoreV1().PersistentVolumes().Get(ctx, "pvc-1111", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Fatalf("the old PV is still there: %v", err)
			}
			pv, err := kube.CoreV1().PersistentVolumes().Get(ctx, "pvc-1111-spindle", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c := pv.Spec.CSI
			if c.Driver != testDriver || c.VolumeHandle != "rbd/ceph/replicapool/csi-vol-6b9f" || c.FSType != "ext4" || c.VolumeAttributes["pool"] != "replicapool" ||
				c.NodeStageSecretRef == nil || c.NodeStageSecretRef.Name != "rook-csi-rbd-node" || c.ControllerExpandSecretRef == nil || c.ControllerPublishSecretRef != nil ||
				pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || pv.Spec.StorageClassName != "rook-ceph-block" ||
				pv.Spec.ClaimRef.Name != "data" || pv.Annotations["pv.kubernetes.io/provisioned-by"] != testDriver ||
				pv.Annotations["volume.kubernetes.io/provisioner-deletion-secret-name"] != "rook-csi-rbd-provisioner" ||
				pv.Annotations[adoptedFromAnnotation] != "rook-ceph.rbd.csi.ceph.com/0001-0009-rook-ceph-0000000000000002-6b9f" || pv.Annotations[adoptStateAnnotation] != "" {
				t.Fatalf("new PV %+v %+v", pv.ObjectMeta, pv.Spec)
			}
			claim, err := kube.CoreV1().PersistentVolumeClaims("db").Get(ctx, "data", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if claim.Spec.VolumeName != "pvc-1111-spindle" || *claim.Spec.StorageClassName != "rook-ceph-block" || claim.Labels["app"] != "pg" ||
				claim.Annotations["team"] != "payments" || claim.Annotations["pv.kubernetes.io/bind-completed"] != "" {
				t.Fatalf("new claim %+v", claim)
			}
			ss, _ := kube.AppsV1().StatefulSets("db").Get(ctx, "pg", metav1.GetOptions{})
			if *ss.Spec.Replicas != 1 {
				t.Fatalf("the StatefulSet has %d replicas, want 1 back", *ss.Spec.Replicas)
			}
			adoptions := 0
			for _, r := range ctrl.calls {
				if !r.DryRun {
					adoptions++
				}
			}
			if adoptions < 2 || !ctrl.calls[0].DryRun {
				t.Fatalf("controller calls %+v: want a dry run first, then the adoption", ctrl.calls)
			}
		})
	}
}

// TestAdoptRefuses: what adopt cannot move it refuses before changing
// anything, saying why.
func TestAdoptRefuses(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name   string
		change func(kube *fake.Clientset)
		ctrl   error
		open   []string // who has the image open, for the controller
		want   string
	}{
		{"a bare pod", func(kube *fake.Clientset) {
			_ = kube.Tracker().Add(pod("db", "debug", "worker-2", "data"))
		}, nil, nil, "pod db/debug uses claim data and no controller runs it"},
		{"not ceph-csi's", func(kube *fake.Clientset) {
			pv, _ := kube.CoreV1().PersistentVolumes().Get(ctx, "pvc-1111", metav1.GetOptions{})
			pv.Spec.CSI.Driver = "ebs.csi.aws.com"
			_, _ = kube.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{})
		}, nil, nil, "adopt takes ceph-csi's RBD volumes"},
		{"no image name", func(kube *fake.Clientset) {
			pv, _ := kube.CoreV1().PersistentVolumes().Get(ctx, "pvc-1111", metav1.GetOptions{})
			delete(pv.Spec.CSI.VolumeAttributes, "imageName")
			_, _ = kube.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{})
		}, nil, nil, "no volumeAttributes.imageName"},
		{"two Spindle classes fit", func(kube *fake.Clientset) {
			sc, _ := kube.StorageV1().StorageClasses().Get(ctx, "rook-ceph-block", metav1.GetOptions{})
			sc.Name = "rook-ceph-block-2"
			sc.ResourceVersion = ""
			_, _ = kube.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{})
		}, nil, nil, "--storage-class"},
		{"no credentials for the controller", func(kube *fake.Clientset) {
			sc, _ := kube.StorageV1().StorageClasses().Get(ctx, "rook-ceph-block", metav1.GetOptions{})
			delete(sc.Parameters, "csi.storage.k8s.io/provisioner-secret-name")
			_, _ = kube.StorageV1().StorageClasses().Update(ctx, sc, metav1.UpdateOptions{})
		}, nil, nil, "names no provisioner secret"},
		{"the controller refuses", nil, errors.New("HTTP 412: adopt replicapool/csi-vol-6b9f: the image is still open"), nil, "the controller cannot adopt"},
		{"open, but not for the claim's pods", func(kube *fake.Clientset) {
			_ = kube.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), "db", "pg-0")
			_ = kube.Tracker().Delete(storagev1.SchemeGroupVersion.WithResource("volumeattachments"), "", va("pvc-1111", "worker-1", attached).Name)
		}, nil, []string{"10.0.0.9:0/1234"}, "is open by 10.0.0.9:0/1234, but no pod uses claim db/data and PV pvc-1111 is attached to no node"},
		// ceph-csi's class said encrypted: its PV's attributes carry it,
		// and the controller's dry run refuses the image (static.go).
		{"ceph-csi encrypted it", func(kube *fake.Clientset) {
			pv, _ := kube.CoreV1().PersistentVolumes().Get(ctx, "pvc-1111", metav1.GetOptions{})
			pv.Spec.CSI.VolumeAttributes["encrypted"] = "true"
			pv.Spec.CSI.VolumeAttributes["encryptionKMSID"] = "vault"
			_, _ = kube.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{})
		}, errors.New(`HTTP 400: handle "0001-0009-rook-ceph-0000000000000002-6b9f": its volume attributes say encrypted "true", but Spindle opens only the encrypted volumes it created`), nil, "opens only the encrypted volumes it created"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			kube := cephCSICluster(t)
			if tt.change != nil {
				tt.change(kube)
			}
			before := len(kube.Actions())
			_, err := Adopt(ctx, kube, "db", "data", &recordingAdopter{fail: tt.ctrl, openBy: func() []string { return tt.open }}, adoptOpts(nil, false))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("adopt = %v, want an error naming %q", err, tt.want)
			}
			for _, a := range kube.Actions()[before:] {
				if v := a.GetVerb(); v != "get" && v != "list" {
					t.Fatalf("a refused adopt changed the cluster: %s %s", v, a.GetResource().Resource)
				}
			}
		})
	}
	_, err := Adopt(ctx, cephCSICluster(t), "db", "pv/pvc-1111", &recordingAdopter{}, adoptOpts(nil, false))
	if err == nil || !strings.Contains(err.Error(), "adopt takes a claim") {
		t.Fatalf("adopt pv/...: %v", err)
	}
}

// TestAdoptOpenImage: the claim's pod runs, so ceph-csi has the image
// mapped (the controller's dry run answers it open by the node's client).
// The dry run says so and that the real run scales down first; the real
// run scales down, waits for the detach, and only then adopts (the
// controller refuses an image still open), and scales the StatefulSet back.
func TestAdoptOpenImage(t *testing.T) {
	ctx := context.Background()
	kube := cephCSICluster(t)
	ctrl := &recordingAdopter{openBy: mappedWhilePodRuns(kube)}
	var log bytes.Buffer
	a, err := Adopt(ctx, kube, "db", "pvc/data", ctrl, adoptOpts(&log, true))
	if err != nil {
		t.Fatalf("adopt --dry-run of a claim whose pod runs: %v", err)
	}
	note := "image replicapool/csi-vol-6b9f (cluster rook-ceph) is open by 10.0.0.7:0/3411306950 (mapped on the node of the claim's pods): the workloads are scaled down and the PV detached before the controller adopts it"
	if !strings.Contains(log.String(), note) || !slices.Equal(a.ImageOpenBy, []string{"10.0.0.7:0/3411306950"}) {
		t.Fatalf("the dry run does not say the image is open (%v):\n%s", a.ImageOpenBy, log.String())
	}
	var out bytes.Buffer
	printAdoption(&out, a)
	if want := "dry run: nothing was changed; adopt db/data would do the 11 steps above\nimage open by 10.0.0.7:0/3411306950 now: the real run scales the workloads down first"; !strings.Contains(out.String(), want) {
		t.Fatalf("the dry run's summary:\n%s\nwant %q", out.String(), want)
	}

	log.Reset()
	if _, err := Adopt(ctx, kube, "db", "pvc/data", ctrl, adoptOpts(&log, false)); err != nil {
		t.Fatalf("adopt: %v\n%s", err, log.String())
	}
	if claim, err := kube.CoreV1().PersistentVolumeClaims("db").Get(ctx, "data", metav1.GetOptions{}); err != nil || claim.Spec.VolumeName != "pvc-1111-spindle" {
		t.Fatalf("the claim after adopt: %+v, %v", claim, err)
	}
	if ss, _ := kube.AppsV1().StatefulSets("db").Get(ctx, "pg", metav1.GetOptions{}); *ss.Spec.Replicas != 1 {
		t.Fatalf("the StatefulSet has %d replicas, want 1 back", *ss.Spec.Replicas)
	}
}

// TestAdoptProvisionerGone: ceph-csi's provisioner is uninstalled, so
// nothing drops its finalizer from the retained old PV, which would never
// go: adopt says so, removes that one finalizer, and finishes.
func TestAdoptProvisionerGone(t *testing.T) {
	ctx := context.Background()
	kube := cephCSICluster(t)
	pvs := corev1.SchemeGroupVersion.WithResource("persistentvolumes")
	old, _ := kube.CoreV1().PersistentVolumes().Get(ctx, "pvc-1111", metav1.GetOptions{})
	old.Finalizers = []string{"kubernetes.io/pv-protection", provisionerFinalizer}
	if err := kube.Tracker().Update(pvs, old, ""); err != nil {
		t.Fatal(err)
	}
	// The API server: a PV with finalizers is only marked deleted, and
	// goes once they are all gone (the PV controller drops
	// kubernetes.io/pv-protection from a PV with no claim).
	kube.PrependReactor("delete", "persistentvolumes", func(action k8stesting.Action) (bool, runtime.Object, error) {
		obj, err := kube.Tracker().Get(pvs, "", action.(k8stesting.DeleteAction).GetName())
		if err != nil || len(obj.(*corev1.PersistentVolume).Finalizers) == 0 {
			return false, nil, nil
		}
		pv := obj.(*corev1.PersistentVolume)
		pv.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		return true, nil, kube.Tracker().Update(pvs, pv, "")
	})
	kube.PrependReactor("get", "persistentvolumes", func(action k8stesting.Action) (bool, runtime.Object, error) {
		name := action.(k8stesting.GetAction).GetName()
		obj, err := kube.Tracker().Get(pvs, "", name)
		if err != nil || obj.(*corev1.PersistentVolume).DeletionTimestamp == nil {
			return false, nil, nil
		}
		pv := obj.(*corev1.PersistentVolume)
		pv.Finalizers = slices.DeleteFunc(pv.Finalizers, func(f string) bool { return f == "kubernetes.io/pv-protection" })
		if len(pv.Finalizers) == 0 {
			_ = kube.Tracker().Delete(pvs, "", name)
			return true, nil, apierrors.NewNotFound(pvs.GroupResource(), name)
		}
		return true, pv, kube.Tracker().Update(pvs, pv, "")
	})
	var log bytes.Buffer
	if _, err := Adopt(ctx, kube, "db", "pvc/data", &recordingAdopter{}, adoptOpts(&log, false)); err != nil {
		t.Fatalf("adopt: %v\n%s", err, log.String())
	}
	if want := "PV pvc-1111 (retained, its claim gone) still has finalizer external-provisioner.volume.kubernetes.io/finalizer after the delete: ceph-csi's provisioner, which drops it from a retained PV, is not running; removing that finalizer (the image stays: PV pvc-1111-spindle names it)"; !strings.Contains(log.String(), want) {
		t.Fatalf("adopt did not say why it removes the finalizer:\n%s", log.String())
	}
	if _, err := kube.CoreV1().PersistentVolumes().Get(ctx, "pvc-1111", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the old PV is still there: %v", err)
	}
	for _, act := range kube.Actions() {
		p, ok := act.(k8stesting.PatchAction)
		if !ok || p.GetPatchType() != types.JSONPatchType {
			continue
		}
		var ops []map[string]string
		if json.Unmarshal(p.GetPatch(), &ops) != nil || len(ops) != 2 || ops[0]["op"] != "test" || ops[0]["value"] != provisionerFinalizer ||
			ops[1]["op"] != "remove" || ops[1]["path"] != ops[0]["path"] {
			t.Fatalf("adopt patched PV %s with %s: want the provisioner's finalizer removed, nothing else", p.GetName(), p.GetPatch())
		}
	}
	if claim, err := kube.CoreV1().PersistentVolumeClaims("db").Get(ctx, "data", metav1.GetOptions{}); err != nil || claim.Spec.VolumeName != "pvc-1111-spindle" {
		t.Fatalf("the claim after adopt: %+v, %v", claim, err)
	}
}
