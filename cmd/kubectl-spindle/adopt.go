package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/spindle-csi/spindle/internal/opsapi"
)

// Adopting a ceph-csi volume in place. A bound claim whose PV belongs to
// ceph-csi's RBD driver moves to Spindle without copying a byte: its
// workloads are scaled to zero, the PV is kept (Retain), the controller
// gives the image Spindle's records (POST /volumes/adopt), a Spindle PV
// naming the same image and a claim of the same name are bound, and the
// workloads scale back. Every step is idempotent, and where the claim is
// between drivers the PV carries what adopt needs to go on
// (adoptStateAnnotation), so running adopt again finishes an adoption
// that stopped part-way.

// adoptStateAnnotation holds, on the PV of a claim being adopted, the
// claim as it was and the workloads' replicas before adopt scaled them.
const adoptStateAnnotation = "spindle.csi.dev/adopt-state"

// adoptedFromAnnotation records on the new PV what it was.
const adoptedFromAnnotation = "spindle.csi.dev/adopted-from"

// AdoptOptions are adopt's flags.
type AdoptOptions struct {
	Driver string // Spindle's driver name
	// StorageClass is the Spindle StorageClass the claim gets; "" picks
	// one whose clusterID and pool are the PV's.
	StorageClass string
	// Secret ("namespace/name") holds the credentials the controller
	// reaches the image with; "" takes the StorageClass's provisioner
	// secret.
	Secret  string
	DryRun  bool
	Timeout time.Duration // of each wait
	Poll    time.Duration
	Log     io.Writer // each step as it is done
}

// AdoptController is the controller's adopt endpoint.
type AdoptController interface {
	Adopt(ctx context.Context, req opsapi.AdoptRequest) (*opsapi.AdoptedVolume, error)
}

// Workload is a controller of pods that use the claim.
type Workload struct {
	Kind     string `json:"kind"` // Deployment, StatefulSet, ReplicaSet
	Name     string `json:"name"`
	Replicas int32  `json:"replicas"` // before adopt scaled it
}

func (w Workload) String() string { return strings.ToLower(w.Kind) + "/" + w.Name }

// Adoption is what adopt did or, with DryRun, would do.
type Adoption struct {
	Claim        string     `json:"claim"` // namespace/name
	OldPV        string     `json:"oldPV"`
	OldDriver    string     `json:"oldDriver"`
	OldHandle    string     `json:"oldHandle"`
	NewPV        string     `json:"newPV"`
	StorageClass string     `json:"storageClass"`
	VolumeID     string     `json:"volumeID,omitempty"`
	Workloads    []Workload `json:"workloads"`
	// ImageOpenBy names the clients that had the image open when adopt
	// checked it (ceph-csi's mappings on the nodes of the claim's pods):
	// the workloads are scaled down before the image is adopted.
	ImageOpenBy []string `json:"imageOpenBy,omitempty"`
	Steps       []string `json:"steps"`
	DryRun      bool     `json:"dryRun,omitempty"`
}

// adoptState is what the PV of a claim being adopted carries.
type adoptState struct {
	Claim         corev1.PersistentVolumeClaim         `json:"claim"`
	Workloads     []Workload                           `json:"workloads"`
	ReclaimPolicy corev1.PersistentVolumeReclaimPolicy `json:"reclaimPolicy"`
	StorageClass  string                               `json:"storageClass"`
	OldPV         string                               `json:"oldPV"`
}

// adopter runs one adoption.
type adopter struct {
	kube kubernetes.Interface
	ctrl AdoptController
	o    AdoptOptions
	out  *Adoption
}

// step does one thing (or, with DryRun, says it would) and logs it.
func (a *adopter) step(what string, do func() error) error {
	if a.o.DryRun {
		what = "would " + what
	} else if do != nil {
		if err := do(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	a.out.Steps = append(a.out.Steps, what)
	if a.o.Log != nil {
		fmt.Fprintf(a.o.Log, "adopt: %s\n", what)
	}
	return nil
}

// note logs what adopt found (not a change).
func (a *adopter) note(what string) {
	a.out.Steps = append(a.out.Steps, what)
	if a.o.Log != nil {
		fmt.Fprintf(a.o.Log, "adopt: %s\n", what)
	}
}

// Adopt moves claim (pvc/NAME or NAME, in namespace) onto Spindle.
func Adopt(ctx context.Context, kube kubernetes.Interface, namespace, claim string, ctrl AdoptController, o AdoptOptions) (*Adoption, error) {
	name, ok := strings.CutPrefix(claim, "pvc/")
	if !ok && strings.Contains(claim, "/") {
		return nil, fmt.Errorf("adopt takes a claim (NAME or pvc/NAME), not %q", claim)
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.Poll <= 0 {
		o.Poll = time.Second
	}
	a := &adopter{kube: kube, ctrl: ctrl, o: o, out: &Adoption{Claim: namespace + "/" + name, DryRun: o.DryRun, Workloads: []Workload{}, Steps: []string{}}}
	pvc, err := kube.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return a.resume(ctx, namespace, name)
	case err != nil:
		return nil, asPermissionError(err, "get", "persistentvolumeclaims", namespace)
	}
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
		return nil, fmt.Errorf("claim %s is %s, not bound: adopt moves a bound claim", a.out.Claim, pvc.Status.Phase)
	}
	pv, err := kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return nil, asPermissionError(err, "get", "persistentvolumes", "")
	}
	if pv.Spec.CSI == nil {
		return nil, fmt.Errorf("PV %s of claim %s is no CSI volume", pv.Name, a.out.Claim)
	}
	if pv.Spec.CSI.Driver == o.Driver {
		if pv.Annotations[adoptStateAnnotation] != "" {
			// Bound to the new PV already: only the workloads are left.
			st, err := stateOf(pv)
			if err != nil {
				return nil, err
			}
			return a.finish(ctx, st, pv.Name, pv.Spec.CSI.VolumeHandle)
		}
		return nil, fmt.Errorf("claim %s is a %s volume already (PV %s)", a.out.Claim, o.Driver, pv.Name)
	}
	return a.start(ctx, pvc, pv)
}

// start adopts a claim still bound to the other driver's PV.
func (a *adopter) start(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) (*Adoption, error) {
	a.describeOld(pv)
	if !strings.HasSuffix(pv.Spec.CSI.Driver, "rbd.csi.ceph.com") {
		return nil, fmt.Errorf("PV %s belongs to driver %s; adopt takes ceph-csi's RBD volumes (drivers named *rbd.csi.ceph.com)", pv.Name, pv.Spec.CSI.Driver)
	}
	for _, k := range []string{"clusterID", "pool", "imageName"} {
		if pv.Spec.CSI.VolumeAttributes[k] == "" {
			return nil, fmt.Errorf("PV %s has no volumeAttributes.%s: it does not say where its image is", pv.Name, k)
		}
	}
	st, err := stateOf(pv)
	if err != nil {
		return nil, err
	}
	if st == nil {
		sc, err := a.storageClass(ctx, pvc, pv)
		if err != nil {
			return nil, err
		}
		workloads, err := a.workloads(ctx, pvc.Namespace, pvc.Name)
		if err != nil {
			return nil, err
		}
		claim := pvc.DeepCopy()
		claim.ObjectMeta = metav1.ObjectMeta{Name: pvc.Name, Namespace: pvc.Namespace, Labels: pvc.Labels, Annotations: withoutBindAnnotations(pvc.Annotations)}
		claim.Status = corev1.PersistentVolumeClaimStatus{}
		st = &adoptState{Claim: *claim, Workloads: workloads, ReclaimPolicy: pv.Spec.PersistentVolumeReclaimPolicy, StorageClass: sc.Name, OldPV: pv.Name}
	}
	a.out.StorageClass, a.out.Workloads = st.StorageClass, st.Workloads
	sc, err := a.kube.StorageV1().StorageClasses().Get(ctx, st.StorageClass, metav1.GetOptions{})
	if err != nil {
		return nil, asPermissionError(err, "get", "storageclasses", "")
	}
	req, err := a.adoptRequest(ctx, pv, sc)
	if err != nil {
		return nil, err
	}
	// The controller checks the image, its location and the parameters
	// before anything is changed. This comes before the scale-down, so
	// the image may well be open (the claim's pods run): the controller's
	// dry run says by whom rather than refusing, and the real adoption,
	// after the scale-down and the detach, refuses an image still open.
	dry := req
	dry.DryRun = true
	checked, err := a.ctrl.Adopt(ctx, dry)
	if err != nil {
		return nil, fmt.Errorf("the controller cannot adopt image %s: %w", imageOf(pv), err)
	}
	a.out.VolumeID = checked.VolumeID
	a.note(fmt.Sprintf("checked: %s (PV %s, driver %s) is image %s, which the controller adopts as volume %s of StorageClass %s", a.out.Claim, pv.Name, pv.Spec.CSI.Driver, imageOf(pv), checked.VolumeID, sc.Name))
	if len(checked.OpenBy) > 0 {
		a.out.ImageOpenBy = checked.OpenBy
		used, err := a.inUse(ctx, pvc.Namespace, pvc.Name, pv.Name)
		if err != nil {
			return nil, err
		}
		if !used {
			// Scaling down closes only what the claim's pods opened.
			return nil, fmt.Errorf("image %s is open by %s, but no pod uses claim %s and PV %s is attached to no node: something else has it open (another PV naming the image, an rbd map by hand); adopt changes nothing while it is open: find it with rbd status, stop it, and run adopt again",
				imageOf(pv), strings.Join(checked.OpenBy, ", "), a.out.Claim, pv.Name)
		}
		a.note(fmt.Sprintf("image %s is open by %s (mapped on the node of the claim's pods): the workloads are scaled down and the PV detached before the controller adopts it, which it does only once nothing has it open", imageOf(pv), strings.Join(checked.OpenBy, ", ")))
	}
	if err := a.step(fmt.Sprintf("record the claim and its workloads' replicas on PV %s (annotation %s)", pv.Name, adoptStateAnnotation), func() error {
		return a.annotate(ctx, pv.Name, st)
	}); err != nil {
		return nil, err
	}
	if err := a.scaleDown(ctx, pvc.Namespace, pvc.Name, pv.Name, st.Workloads); err != nil {
		return nil, err
	}
	if err := a.step(fmt.Sprintf("keep PV %s and its image when the claim goes (reclaim policy %s -> Retain)", pv.Name, pv.Spec.PersistentVolumeReclaimPolicy), func() error {
		return a.retain(ctx, pv.Name)
	}); err != nil {
		return nil, err
	}
	if err := a.step(fmt.Sprintf("give image %s Spindle's records (the controller, in place: no data copied)", imageOf(pv)), func() error {
		adopted, err := a.ctrl.Adopt(ctx, req)
		if err == nil {
			a.out.VolumeID = adopted.VolumeID
		}
		return err
	}); err != nil {
		return nil, err
	}
	if err := a.step(fmt.Sprintf("delete claim %s (bound to the retained PV %s) and wait until it is gone", a.out.Claim, pv.Name), func() error {
		return a.deleteClaim(ctx, pvc.Namespace, pvc.Name)
	}); err != nil {
		return nil, err
	}
	return a.bindNew(ctx, st, pv, sc, req)
}

// describeOld fills in the old PV's part of the result.
func (a *adopter) describeOld(pv *corev1.PersistentVolume) {
	a.out.OldPV, a.out.OldDriver, a.out.OldHandle = pv.Name, pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle
	a.out.NewPV = newPVName(pv.Name)
}

// newPVName is the name of the Spindle PV that replaces pv: the volume's
// CSI name too.
func newPVName(old string) string { return old + "-spindle" }

// bindNew creates the Spindle PV, removes the old one and binds a claim
// of the same name to the new one, then finishes.
func (a *adopter) bindNew(ctx context.Context, st *adoptState, old *corev1.PersistentVolume, sc *storagev1.StorageClass, req opsapi.AdoptRequest) (*Adoption, error) {
	req.DryRun = a.o.DryRun
	adopted, err := a.ctrl.Adopt(ctx, req) // idempotent: the volume as it is (or would be)
	if err != nil {
		return nil, fmt.Errorf("the controller: %w", err)
	}
	a.out.VolumeID = adopted.VolumeID
	newPV := a.newPV(st, old, sc, adopted)
	if err := a.step(fmt.Sprintf("create PV %s (driver %s, volume %s, StorageClass %s) bound in advance to claim %s", newPV.Name, a.o.Driver, adopted.VolumeID, sc.Name, a.out.Claim), func() error {
		_, err := a.kube.CoreV1().PersistentVolumes().Create(ctx, newPV, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return asPermissionError(err, "create", "persistentvolumes", "")
	}); err != nil {
		return nil, err
	}
	deleteOld := fmt.Sprintf("delete PV %s (retained: its image stays)", old.Name)
	if slices.Contains(old.Finalizers, provisionerFinalizer) {
		deleteOld += fmt.Sprintf("; remove its finalizer %s should it stay (it does when ceph-csi's provisioner, which drops it from a retained PV, is not running)", provisionerFinalizer)
	}
	if err := a.step(deleteOld, func() error {
		return a.deletePV(ctx, old.Name, newPV.Name)
	}); err != nil {
		return nil, err
	}
	return a.bindClaim(ctx, st, sc, newPV.Name, adopted.VolumeID)
}

// bindClaim creates the claim of the same name on the new PV and finishes.
func (a *adopter) bindClaim(ctx context.Context, st *adoptState, sc *storagev1.StorageClass, pvName, volumeID string) (*Adoption, error) {
	claim := st.Claim.DeepCopy()
	claim.Spec.StorageClassName = &sc.Name
	claim.Spec.VolumeName = pvName
	if err := a.step(fmt.Sprintf("create claim %s (StorageClass %s, volumeName %s) and wait until it is bound", a.out.Claim, sc.Name, pvName), func() error {
		return a.createClaim(ctx, claim)
	}); err != nil {
		return nil, err
	}
	return a.finish(ctx, st, pvName, volumeID)
}

// finish scales the workloads back and drops the adoption's record from
// the new PV.
func (a *adopter) finish(ctx context.Context, st *adoptState, pvName, volumeID string) (*Adoption, error) {
	a.out.NewPV, a.out.VolumeID, a.out.StorageClass, a.out.Workloads = pvName, volumeID, st.StorageClass, st.Workloads
	if a.out.OldPV == "" {
		a.out.OldPV = st.OldPV
	}
	for _, w := range st.Workloads {
		if err := a.step(fmt.Sprintf("scale %s back to %d replicas", w, w.Replicas), func() error {
			return a.scale(ctx, st.Claim.Namespace, w, w.Replicas)
		}); err != nil {
			return nil, err
		}
	}
	if err := a.step(fmt.Sprintf("remove annotation %s from PV %s", adoptStateAnnotation, pvName), func() error {
		patch := []byte(`{"metadata":{"annotations":{"` + adoptStateAnnotation + `":null}}}`)
		_, err := a.kube.CoreV1().PersistentVolumes().Patch(ctx, pvName, types.MergePatchType, patch, metav1.PatchOptions{})
		return asPermissionError(err, "patch", "persistentvolumes", "")
	}); err != nil {
		return nil, err
	}
	return a.out, nil
}

// resume goes on with an adoption whose claim is gone: a PV carries its
// state (the old one, or the new one once it exists).
func (a *adopter) resume(ctx context.Context, namespace, name string) (*Adoption, error) {
	pvs, err := a.kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, asPermissionError(err, "list", "persistentvolumes", "")
	}
	var old, fresh *corev1.PersistentVolume
	var st *adoptState
	for i := range pvs.Items {
		pv := &pvs.Items[i]
		s, err := stateOf(pv)
		if err != nil || s == nil || s.Claim.Namespace != namespace || s.Claim.Name != name {
			continue
		}
		st = s
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == a.o.Driver {
			fresh = pv
		} else {
			old = pv
		}
	}
	if st == nil {
		return nil, fmt.Errorf("claim %s/%s does not exist, and no PV carries an adoption of it (annotation %s)", namespace, name, adoptStateAnnotation)
	}
	a.out.StorageClass, a.out.Workloads = st.StorageClass, st.Workloads
	sc, err := a.kube.StorageV1().StorageClasses().Get(ctx, st.StorageClass, metav1.GetOptions{})
	if err != nil {
		return nil, asPermissionError(err, "get", "storageclasses", "")
	}
	if old != nil {
		a.describeOld(old)
		req, err := a.adoptRequest(ctx, old, sc)
		if err != nil {
			return nil, err
		}
		a.note(fmt.Sprintf("resumed: claim %s is gone, PV %s (retained) carries the adoption", a.out.Claim, old.Name))
		return a.bindNew(ctx, st, old, sc, req)
	}
	a.note(fmt.Sprintf("resumed: claim %s is gone, the new PV %s carries the adoption", a.out.Claim, fresh.Name))
	return a.bindClaim(ctx, st, sc, fresh.Name, fresh.Spec.CSI.VolumeHandle)
}

func stateOf(pv *corev1.PersistentVolume) (*adoptState, error) {
	v := pv.Annotations[adoptStateAnnotation]
	if v == "" {
		return nil, nil
	}
	var st adoptState
	if err := json.Unmarshal([]byte(v), &st); err != nil {
		return nil, fmt.Errorf("PV %s: annotation %s: %w", pv.Name, adoptStateAnnotation, err)
	}
	return &st, nil
}

func imageOf(pv *corev1.PersistentVolume) string {
	attrs := pv.Spec.CSI.VolumeAttributes
	spec := attrs["pool"] + "/"
	if ns := attrs["radosNamespace"]; ns != "" {
		spec += ns + "/"
	}
	return spec + attrs["imageName"] + " (cluster " + attrs["clusterID"] + ")"
}

// withoutBindAnnotations drops what the PV controller and the provisioner
// wrote on the old claim.
func withoutBindAnnotations(in map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range in {
		switch k {
		case "pv.kubernetes.io/bind-completed", "pv.kubernetes.io/bound-by-controller",
			"volume.beta.kubernetes.io/storage-provisioner", "volume.kubernetes.io/storage-provisioner",
			"volume.kubernetes.io/selected-node", "kubectl.kubernetes.io/last-applied-configuration":
			continue
		}
		out[k] = v
	}
	return out
}

// storageClass picks the Spindle StorageClass the claim gets.
func (a *adopter) storageClass(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) (*storagev1.StorageClass, error) {
	classes := a.kube.StorageV1().StorageClasses()
	if a.o.StorageClass != "" {
		sc, err := classes.Get(ctx, a.o.StorageClass, metav1.GetOptions{})
		if err != nil {
			return nil, asPermissionError(err, "get", "storageclasses", "")
		}
		if sc.Provisioner != a.o.Driver {
			return nil, fmt.Errorf("StorageClass %s is provisioned by %s, not %s", sc.Name, sc.Provisioner, a.o.Driver)
		}
		return sc, nil
	}
	if name := pvc.Spec.StorageClassName; name != nil && *name != "" {
		if sc, err := classes.Get(ctx, *name, metav1.GetOptions{}); err == nil && sc.Provisioner == a.o.Driver {
			return sc, nil
		}
	}
	list, err := classes.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, asPermissionError(err, "list", "storageclasses", "")
	}
	attrs := pv.Spec.CSI.VolumeAttributes
	var fit []*storagev1.StorageClass
	for i := range list.Items {
		sc := &list.Items[i]
		if sc.Provisioner == a.o.Driver && sc.Parameters["clusterID"] == attrs["clusterID"] && sc.Parameters["pool"] == attrs["pool"] {
			fit = append(fit, sc)
		}
	}
	if len(fit) != 1 {
		names := make([]string, 0, len(fit))
		for _, sc := range fit {
			names = append(names, sc.Name)
		}
		return nil, fmt.Errorf("%d StorageClasses of %s have clusterID %s and pool %s (%s): name the one claim %s gets with --storage-class",
			len(fit), a.o.Driver, attrs["clusterID"], attrs["pool"], strings.Join(names, ", "), a.out.Claim)
	}
	return fit[0], nil
}

// workloads finds the controllers of the pods that use the claim: pods
// that no Deployment, StatefulSet or ReplicaSet runs cannot be scaled, and
// adopt refuses them by name.
func (a *adopter) workloads(ctx context.Context, namespace, claim string) ([]Workload, error) {
	pods, err := a.podsUsing(ctx, namespace, claim)
	if err != nil {
		return nil, err
	}
	var out []Workload
	add := func(w Workload) {
		if !slices.ContainsFunc(out, func(x Workload) bool { return x.Kind == w.Kind && x.Name == w.Name }) {
			out = append(out, w)
		}
	}
	for _, p := range pods {
		owner := metav1.GetControllerOf(&p)
		switch {
		case owner == nil:
			return nil, fmt.Errorf("pod %s/%s uses claim %s and no controller runs it: delete it (or give it one) and run adopt again", namespace, p.Name, claim)
		case owner.Kind == "StatefulSet":
			ss, err := a.kube.AppsV1().StatefulSets(namespace).Get(ctx, owner.Name, metav1.GetOptions{})
			if err != nil {
				return nil, asPermissionError(err, "get", "statefulsets", namespace)
			}
			add(Workload{Kind: "StatefulSet", Name: ss.Name, Replicas: replicasOf(ss.Spec.Replicas)})
		case owner.Kind == "ReplicaSet":
			rs, err := a.kube.AppsV1().ReplicaSets(namespace).Get(ctx, owner.Name, metav1.GetOptions{})
			if err != nil {
				return nil, asPermissionError(err, "get", "replicasets", namespace)
			}
			if d := metav1.GetControllerOf(rs); d != nil && d.Kind == "Deployment" {
				dep, err := a.kube.AppsV1().Deployments(namespace).Get(ctx, d.Name, metav1.GetOptions{})
				if err != nil {
					return nil, asPermissionError(err, "get", "deployments", namespace)
				}
				add(Workload{Kind: "Deployment", Name: dep.Name, Replicas: replicasOf(dep.Spec.Replicas)})
				continue
			}
			add(Workload{Kind: "ReplicaSet", Name: rs.Name, Replicas: replicasOf(rs.Spec.Replicas)})
		default:
			return nil, fmt.Errorf("pod %s/%s uses claim %s and is run by %s/%s, which adopt cannot scale down: stop it and run adopt again", namespace, p.Name, claim, strings.ToLower(owner.Kind), owner.Name)
		}
	}
	return out, nil
}

func replicasOf(r *int32) int32 {
	if r == nil {
		return 1
	}
	return *r
}

func (a *adopter) podsUsing(ctx context.Context, namespace, claim string) ([]corev1.Pod, error) {
	list, err := a.kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, asPermissionError(err, "list", "pods", namespace)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim {
				out = append(out, p)
				break
			}
		}
	}
	return out, nil
}

// scaleDown scales the workloads to zero and waits until no pod uses the
// claim and no VolumeAttachment holds the old PV: the image is unmapped
// everywhere.
func (a *adopter) scaleDown(ctx context.Context, namespace, claim, pv string, ws []Workload) error {
	for _, w := range ws {
		if err := a.step(fmt.Sprintf("scale %s from %d to 0 replicas", w, w.Replicas), func() error {
			return a.scale(ctx, namespace, w, 0)
		}); err != nil {
			return err
		}
	}
	return a.step(fmt.Sprintf("wait until no pod uses claim %s and PV %s is attached to no node", a.out.Claim, pv), func() error {
		return a.wait(ctx, "the claim's pods to stop and its PV to be detached", func() (bool, error) {
			used, err := a.inUse(ctx, namespace, claim, pv)
			return !used, err
		})
	})
}

// inUse reports whether a pod uses the claim or a VolumeAttachment holds
// its PV: the image may be mapped on a node for them.
func (a *adopter) inUse(ctx context.Context, namespace, claim, pv string) (bool, error) {
	pods, err := a.podsUsing(ctx, namespace, claim)
	if err != nil || len(pods) > 0 {
		return len(pods) > 0, err
	}
	vas, err := a.kube.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, asPermissionError(err, "list", "volumeattachments", "")
	}
	for _, va := range vas.Items {
		if src := va.Spec.Source.PersistentVolumeName; src != nil && *src == pv {
			return true, nil
		}
	}
	return false, nil
}

func (a *adopter) scale(ctx context.Context, namespace string, w Workload, replicas int32) error {
	patch := []byte(`{"spec":{"replicas":` + strconv.Itoa(int(replicas)) + `}}`)
	var err error
	switch w.Kind {
	case "Deployment":
		_, err = a.kube.AppsV1().Deployments(namespace).Patch(ctx, w.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	case "StatefulSet":
		_, err = a.kube.AppsV1().StatefulSets(namespace).Patch(ctx, w.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	case "ReplicaSet":
		_, err = a.kube.AppsV1().ReplicaSets(namespace).Patch(ctx, w.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	default:
		return fmt.Errorf("cannot scale a %s", w.Kind)
	}
	return asPermissionError(err, "patch", strings.ToLower(w.Kind)+"s", namespace)
}

func (a *adopter) annotate(ctx context.Context, pv string, st *adoptState) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{adoptStateAnnotation: string(b)}}})
	_, err = a.kube.CoreV1().PersistentVolumes().Patch(ctx, pv, types.MergePatchType, patch, metav1.PatchOptions{})
	return asPermissionError(err, "patch", "persistentvolumes", "")
}

func (a *adopter) retain(ctx context.Context, pv string) error {
	patch := []byte(`{"spec":{"persistentVolumeReclaimPolicy":"Retain"}}`)
	_, err := a.kube.CoreV1().PersistentVolumes().Patch(ctx, pv, types.MergePatchType, patch, metav1.PatchOptions{})
	return asPermissionError(err, "patch", "persistentvolumes", "")
}

func (a *adopter) deleteClaim(ctx context.Context, namespace, name string) error {
	claims := a.kube.CoreV1().PersistentVolumeClaims(namespace)
	if err := claims.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return asPermissionError(err, "delete", "persistentvolumeclaims", namespace)
	}
	return a.wait(ctx, "claim "+namespace+"/"+name+" to go", func() (bool, error) {
		_, err := claims.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

// provisionerFinalizer is the finalizer the external-provisioner (v5.0.1
// and later, the sidecar of ceph-csi's provisioner) puts on the PVs of its
// driver whose reclaim policy is Delete, so that such a PV goes only once
// its volume is deleted; it drops it itself from a PV that is changed to
// Retain.
const provisionerFinalizer = "external-provisioner.volume.kubernetes.io/finalizer"

// deletePV deletes the retained PV of the old driver, replaced by the PV
// named by, and waits until it is gone.
func (a *adopter) deletePV(ctx context.Context, name, by string) error {
	pvs := a.kube.CoreV1().PersistentVolumes()
	pv, err := pvs.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
		return fmt.Errorf("PV %s is not retained (%s): deleting it could delete its image", name, pv.Spec.PersistentVolumeReclaimPolicy)
	}
	if err := pvs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return asPermissionError(err, "delete", "persistentvolumes", "")
	}
	err = a.wait(ctx, "PV "+name+" to go", func() (bool, error) {
		pv, err = pvs.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return false, a.dropProvisionerFinalizer(ctx, pv, by)
	})
	if err != nil && pv != nil && len(pv.Finalizers) > 0 {
		return fmt.Errorf("%w: it still has finalizers %s, which the controllers that put them there remove (kubectl get pv %s -o yaml)", err, strings.Join(pv.Finalizers, ", "), name)
	}
	return err
}

// dropProvisionerFinalizer removes provisionerFinalizer from pv, deleted
// and retained, whose claim is gone. The external-provisioner removes it
// itself from a retained PV; when it is still there, ceph-csi's
// provisioner is not running (uninstalled before the adoption, say), and
// the PV would never go. Removing it is what the provisioner would have
// done, and it is safe: the finalizer only holds a PV of reclaim policy
// Delete until its volume is deleted, the PV is Retain (nothing deletes
// the image for it), and Spindle's PV, created before this, names the
// image. Only that one finalizer is removed (a JSON patch that tests it
// is still where it was read); any other stays for its own controller.
func (a *adopter) dropProvisionerFinalizer(ctx context.Context, pv *corev1.PersistentVolume, by string) error {
	i := slices.Index(pv.Finalizers, provisionerFinalizer)
	if i < 0 || pv.DeletionTimestamp == nil {
		return nil
	}
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
		return fmt.Errorf("PV %s is not retained (%s): its finalizer %s stays", pv.Name, pv.Spec.PersistentVolumeReclaimPolicy, provisionerFinalizer)
	}
	if ref := pv.Spec.ClaimRef; ref != nil {
		c, err := a.kube.CoreV1().PersistentVolumeClaims(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		switch {
		case err != nil && !apierrors.IsNotFound(err):
			return asPermissionError(err, "get", "persistentvolumeclaims", ref.Namespace)
		case err == nil && c.Spec.VolumeName == pv.Name:
			return fmt.Errorf("PV %s is still bound to claim %s/%s: its finalizer %s stays", pv.Name, ref.Namespace, ref.Name, provisionerFinalizer)
		}
	}
	a.note(fmt.Sprintf("PV %s (retained, its claim gone) still has finalizer %s after the delete: ceph-csi's provisioner, which drops it from a retained PV, is not running; removing that finalizer (the image stays: PV %s names it)", pv.Name, provisionerFinalizer, by))
	path := "/metadata/finalizers/" + strconv.Itoa(i)
	patch, _ := json.Marshal([]map[string]string{{"op": "test", "path": path, "value": provisionerFinalizer}, {"op": "remove", "path": path}})
	_, err := a.kube.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsInvalid(err) || apierrors.IsConflict(err) {
		return nil // gone, or changed since it was read: the next poll sees it
	}
	return asPermissionError(err, "patch", "persistentvolumes", "")
}

func (a *adopter) createClaim(ctx context.Context, claim *corev1.PersistentVolumeClaim) error {
	claims := a.kube.CoreV1().PersistentVolumeClaims(claim.Namespace)
	if _, err := claims.Create(ctx, claim, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return asPermissionError(err, "create", "persistentvolumeclaims", claim.Namespace)
	}
	return a.wait(ctx, "claim "+claim.Namespace+"/"+claim.Name+" to be bound", func() (bool, error) {
		c, err := claims.Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return c.Status.Phase == corev1.ClaimBound && c.Spec.VolumeName == claim.Spec.VolumeName, nil
	})
}

func (a *adopter) wait(ctx context.Context, what string, done func() (bool, error)) error {
	deadline := time.Now().Add(a.o.Timeout)
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s (run adopt again to go on)", a.o.Timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(a.o.Poll):
		}
	}
}

// adoptRequest is what the controller is asked: the old PV's image, the
// new claim's StorageClass parameters (the sidecars' keys but fstype left
// out) and the credentials of --secret or the class's provisioner secret.
func (a *adopter) adoptRequest(ctx context.Context, pv *corev1.PersistentVolume, sc *storagev1.StorageClass) (opsapi.AdoptRequest, error) {
	params := map[string]string{}
	for k, v := range sc.Parameters {
		if !strings.HasPrefix(k, "csi.storage.k8s.io/") || k == "csi.storage.k8s.io/fstype" {
			params[k] = v
		}
	}
	access := "mount"
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		access = "block"
	}
	fsType := pv.Spec.CSI.FSType
	if fsType == "" && access == "mount" {
		fsType = sc.Parameters["csi.storage.k8s.io/fstype"]
	}
	secrets, err := a.secrets(ctx, sc, pv)
	if err != nil {
		return opsapi.AdoptRequest{}, err
	}
	return opsapi.AdoptRequest{Handle: pv.Spec.CSI.VolumeHandle, Attributes: pv.Spec.CSI.VolumeAttributes, Name: newPVName(pv.Name),
		AccessType: access, FsType: fsType, Parameters: params, Secrets: secrets}, nil
}

// secrets reads the credentials for the controller's call.
func (a *adopter) secrets(ctx context.Context, sc *storagev1.StorageClass, pv *corev1.PersistentVolume) (map[string]string, error) {
	ns, name, ok := strings.Cut(a.o.Secret, "/")
	if a.o.Secret == "" {
		ref := secretRef(sc, "provisioner", pv)
		if ref == nil {
			return nil, fmt.Errorf("StorageClass %s names no provisioner secret (csi.storage.k8s.io/provisioner-secret-name and -namespace): name the Secret with the credentials for the image with --secret NAMESPACE/NAME", sc.Name)
		}
		ns, name, ok = ref.Namespace, ref.Name, true
	}
	if !ok || ns == "" || name == "" {
		return nil, fmt.Errorf("--secret %q: want NAMESPACE/NAME", a.o.Secret)
	}
	s, err := a.kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("the Secret with the credentials for the controller: %w", asPermissionError(err, "get", "secrets", ns))
	}
	out := map[string]string{}
	for k, v := range s.Data {
		out[k] = string(v)
	}
	for k, v := range s.StringData {
		out[k] = v
	}
	return out, nil
}

// secretRef is a StorageClass's csi.storage.k8s.io/<kind>-secret-name and
// -namespace, with the templates the sidecars resolve for a PV.
func secretRef(sc *storagev1.StorageClass, kind string, pv *corev1.PersistentVolume) *corev1.SecretReference {
	name := sc.Parameters["csi.storage.k8s.io/"+kind+"-secret-name"]
	ns := sc.Parameters["csi.storage.k8s.io/"+kind+"-secret-namespace"]
	if name == "" || ns == "" {
		return nil
	}
	r := strings.NewReplacer("${pv.name}", newPVName(pv.Name))
	if c := pv.Spec.ClaimRef; c != nil {
		r = strings.NewReplacer("${pv.name}", newPVName(pv.Name), "${pvc.namespace}", c.Namespace, "${pvc.name}", c.Name)
	}
	return &corev1.SecretReference{Name: r.Replace(name), Namespace: r.Replace(ns)}
}

// newPV is the Spindle PV of the adopted image, as the external-provisioner
// would have made it for a claim of sc: the class's secrets, mount options
// and reclaim policy as the old PV had it, bound in advance to the claim.
func (a *adopter) newPV(st *adoptState, old *corev1.PersistentVolume, sc *storagev1.StorageClass, v *opsapi.AdoptedVolume) *corev1.PersistentVolume {
	b, _ := json.Marshal(st)
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name: newPVName(old.Name),
			Annotations: map[string]string{
				"pv.kubernetes.io/provisioned-by": a.o.Driver,
				adoptedFromAnnotation:             old.Spec.CSI.Driver + "/" + old.Spec.CSI.VolumeHandle,
				adoptStateAnnotation:              string(b),
			},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      old.Spec.Capacity,
			AccessModes:                   old.Spec.AccessModes,
			VolumeMode:                    old.Spec.VolumeMode,
			PersistentVolumeReclaimPolicy: st.ReclaimPolicy,
			StorageClassName:              sc.Name,
			MountOptions:                  sc.MountOptions,
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: st.Claim.Namespace, Name: st.Claim.Name},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver:                     a.o.Driver,
				VolumeHandle:               v.VolumeID,
				FSType:                     old.Spec.CSI.FSType,
				VolumeAttributes:           v.VolumeContext,
				ControllerPublishSecretRef: secretRef(sc, "controller-publish", old),
				NodeStageSecretRef:         secretRef(sc, "node-stage", old),
				NodePublishSecretRef:       secretRef(sc, "node-publish", old),
				ControllerExpandSecretRef:  secretRef(sc, "controller-expand", old),
			}},
		},
	}
	if ref := secretRef(sc, "provisioner", old); ref != nil {
		// What the external-provisioner reads to delete the volume.
		pv.Annotations["volume.kubernetes.io/provisioner-deletion-secret-name"] = ref.Name
		pv.Annotations["volume.kubernetes.io/provisioner-deletion-secret-namespace"] = ref.Namespace
	}
	if pv.Spec.PersistentVolumeReclaimPolicy == "" {
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimDelete
	}
	return pv
}

func printAdoption(w io.Writer, a *Adoption) {
	if a.DryRun {
		steps := 0
		for _, s := range a.Steps {
			if strings.HasPrefix(s, "would ") {
				steps++
			}
		}
		fmt.Fprintf(w, "dry run: nothing was changed; adopt %s would do the %d steps above\n", a.Claim, steps)
		if len(a.ImageOpenBy) > 0 {
			fmt.Fprintf(w, "image open by %s now: the real run scales the workloads down first, and the controller adopts the image only once nothing has it open\n", strings.Join(a.ImageOpenBy, ", "))
		}
		return
	}
	fmt.Fprintf(w, "claim %s is now on %s: PV %s, volume %s (was PV %s of %s, %s)\n", a.Claim, defaultIfEmpty(a.StorageClass, "?"), a.NewPV, a.VolumeID, a.OldPV, defaultIfEmpty(a.OldDriver, "?"), defaultIfEmpty(a.OldHandle, "?"))
}

func defaultIfEmpty(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// Adopting goes to the controller: through the API server's pod proxy
// (POST needs "create" on pods/proxy), or --controller-url directly.

// Adopt posts to the controller pod through the API server.
func (p *proxyController) Adopt(ctx context.Context, req opsapi.AdoptRequest) (*opsapi.AdoptedVolume, error) {
	pod, port, err := p.pod(ctx)
	if err != nil {
		return nil, err
	}
	var out opsapi.AdoptedVolume
	if err := p.proxy.postJSON(ctx, pod, port, opsapi.PathAdopt, adoptRequestTimeout, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// httpAdopter posts to --controller-url.
type httpAdopter struct {
	client *http.Client
	url    string
}

func (h *httpAdopter) Adopt(ctx context.Context, req opsapi.AdoptRequest) (*opsapi.AdoptedVolume, error) {
	var out opsapi.AdoptedVolume
	if err := postJSON(ctx, h.client, baseURL(h.url)+opsapi.PathAdopt, adoptRequestTimeout, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// adoptRequestTimeout bounds one adopt request; the controller gives it a
// minute.
const adoptRequestTimeout = 90 * time.Second

// errNoAdopter: the clients have no way to the controller.
var errNoAdopter = errors.New("adopt cannot reach the controller")
