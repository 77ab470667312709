//go:build cluster

package kubernetes

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/e2e/kube"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"
)

// What Rook users bring, on the throw-away Ceph that `make e2e` starts on
// this machine when it runs the driver as host processes (hack/local-cluster/
// e2e.sh): the driver reaches that Ceph only through a cluster map in
// ceph-csi's format (Rook's rook-ceph-csi-config), as cluster rook-ceph.
// The Kubernetes side is checked through the API server, as every test
// here; the Ceph side (the image's data objects and metadata) with the
// Ceph CLIs against that Ceph. Where the driver cannot reach it (the
// chart's pods, kind, another cluster) the tests skip, saying so.

// rookCeph is the Ceph of the run, from the environment e2e.sh sets.
type rookCeph struct {
	conf, pool, clusterID, controllerURL string
}

func requireRookCeph(t *testing.T) rookCeph {
	t.Helper()
	r := rookCeph{
		conf: os.Getenv("SPINDLE_E2E_CEPH_CONF"), pool: os.Getenv("SPINDLE_E2E_CEPH_POOL"),
		clusterID: os.Getenv("SPINDLE_E2E_CEPH_CLUSTER_ID"), controllerURL: os.Getenv("SPINDLE_E2E_CONTROLLER_URL"),
	}
	if r.conf == "" || r.pool == "" || r.clusterID == "" || r.controllerURL == "" {
		t.Skip("no Ceph that the driver reaches: this test needs the throw-away Ceph that hack/local-cluster/e2e.sh starts on this machine for the driver as host processes (DEPLOY=process), named by SPINDLE_E2E_CEPH_CONF, SPINDLE_E2E_CEPH_POOL, SPINDLE_E2E_CEPH_CLUSTER_ID and SPINDLE_E2E_CONTROLLER_URL; a cluster whose driver runs elsewhere (the chart's pods, kind) cannot reach it")
	}
	return r
}

// cephCommand is a Ceph CLI of the cluster's release: run in the Ceph
// root the cluster's daemons run from (hack/ceph/run), since this
// machine's own Ceph packages are older than any release Spindle
// supports.
func cephCommand(name string, args ...string) *exec.Cmd {
	run, _ := filepath.Abs(filepath.Join("..", "..", "hack", "ceph", "run"))
	return exec.Command(run, append([]string{name}, args...)...)
}

// run runs a Ceph CLI as the cluster's admin.
func (r rookCeph) run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	cmd := cephCommand(name, append(args, "-c", r.conf)...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if e, ok := err.(*exec.ExitError); ok {
			stderr = string(e.Stderr)
		}
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, stderr)
	}
	return out
}

// adminKey is client.admin's key.
func (r rookCeph) adminKey(t *testing.T) string {
	t.Helper()
	out, err := cephCommand("ceph-authtool", "-p", "-n", "client.admin", filepath.Join(filepath.Dir(r.conf), "ceph.client.admin.keyring")).Output()
	if err != nil {
		t.Fatalf("read the admin key: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// dataObjects counts the RADOS objects holding image's data.
func (r rookCeph) dataObjects(t *testing.T, image string) int {
	t.Helper()
	var info struct {
		Prefix string `json:"block_name_prefix"`
	}
	if err := json.Unmarshal(r.run(t, "rbd", "info", "--format", "json", r.pool+"/"+image), &info); err != nil || info.Prefix == "" {
		t.Fatalf("rbd info %s: %v", image, err)
	}
	n := 0
	for _, o := range strings.Fields(string(r.run(t, "rados", "-p", r.pool, "ls"))) {
		if strings.HasPrefix(o, info.Prefix+".") {
			n++
		}
	}
	return n
}

// TestAdoptCephCSIVolume: an image made as ceph-csi makes one (in the
// pool, with data, no Spindle metadata) under a PV and claim of ceph-csi's
// driver (rook-ceph.rbd.csi.ceph.com) moves onto Spindle with `kubectl
// spindle adopt`: the dry run changes nothing, the adoption binds a claim
// of the same name to a Spindle PV of the same image, a pod reads the data
// back, the image's data objects are the same count (nothing copied), and
// a snapshot of the adopted volume restores the same data.
func TestAdoptCephCSIVolume(t *testing.T) {
	r := requireRookCeph(t)
	c := connect(t)
	// Before the test's namespace, so that they go after its claims.
	r.rookNamespace(t, c)
	class, snapClass := rookClasses(t, c)
	ns := c.Namespace(t)
	ctx := context.Background()

	// The image, as ceph-csi's CreateVolume leaves it: csi-vol-<uuid>,
	// layering, its data (block layout of the e2e pod's verify-block).
	const uuid = "6b9ffd6d-4f49-4ea2-9e5b-2bb2e3f9fb4a"
	image := "csi-vol-" + uuid
	const dataBytes = 16 << 20
	data := make([]byte, dataBytes)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	wrote := hex.EncodeToString(sum[:])
	file := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(file, append(data, wrote...), 0o600); err != nil {
		t.Fatal(err)
	}
	r.run(t, "rbd", "import", "--no-progress", "--image-feature", "layering", file, r.pool+"/"+image)
	r.run(t, "rbd", "resize", "--no-progress", "--size", "1024M", r.pool+"/"+image)
	t.Cleanup(func() {
		// The adopted volume is deleted with its claim; a test that
		// failed before the adoption leaves the image.
		if t.Failed() {
			_ = cephCommand("rbd", "rm", "--no-progress", r.pool+"/"+image, "-c", r.conf).Run()
		}
	})
	objects := r.dataObjects(t, image)

	// No ceph-csi runs here. Its CSIDriver requires attach, and its
	// attacher would answer at once; without one, the attach-detach
	// controller's attach of the ceph-csi PV hangs for two minutes a try
	// and holds back the detach that adopt waits for (a run here waited
	// over five minutes). A CSIDriver without attach stands in for it.
	cephDriver := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "rook-ceph.rbd.csi.ceph.com"}, Spec: storagev1.CSIDriverSpec{AttachRequired: new(bool)}}
	if _, err := c.Client.StorageV1().CSIDrivers().Create(ctx, cephDriver, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.StorageV1().CSIDrivers().Delete(context.Background(), cephDriver.Name, metav1.DeleteOptions{})
	})

	// The PV and claim ceph-csi's provisioner made for it.
	oldPV := "pvc-" + uuid
	block := corev1.PersistentVolumeBlock
	cephClass := "rook-ceph-block-of-ceph-csi"
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: oldPV, Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": "rook-ceph.rbd.csi.ceph.com"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:                    &block,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              cephClass,
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: "data"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver:       "rook-ceph.rbd.csi.ceph.com",
				VolumeHandle: "0001-0009-" + r.clusterID + "-0000000000000001-" + uuid,
				VolumeAttributes: map[string]string{
					"clusterID": r.clusterID, "pool": r.pool, "imageName": image, "imageFeatures": "layering", "imageFormat": "2",
					"journalPool": r.pool, "storage.kubernetes.io/csiProvisionerIdentity": "1700000000000-1234-rook-ceph.rbd.csi.ceph.com",
				},
				NodeStageSecretRef: &corev1.SecretReference{Name: "rook-csi-rbd-node", Namespace: "rook-ceph"},
			}},
		},
	}
	if _, err := c.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Retained while adopt runs: a test that failed then leaves it.
		_ = c.Client.CoreV1().PersistentVolumes().Delete(context.Background(), oldPV, metav1.DeleteOptions{})
	})
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &cephClass,
			VolumeMode:       &block,
			VolumeName:       oldPV,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.WaitFor(t, "claim data bound to the ceph-csi PV", func(ctx context.Context) (bool, error) {
		got, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.ClaimBound, err
	})

	// The workload on the claim: a Deployment whose pod cannot start while
	// the claim is ceph-csi's (no ceph-csi runs here), as a workload that
	// adopt scales down and back.
	app := appOn(c, ns, "app", "data")
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, app, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.AppsV1().Deployments(ns).Delete(context.Background(), "app", metav1.DeleteOptions{})
	})
	c.WaitFor(t, "a pod of deployment app", func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=app"})
		return err == nil && len(pods.Items) == 1, err
	})

	dry := c.adopt(t, "pvc/data", "-n", ns, "--dry-run")
	t.Logf("$ kubectl spindle adopt pvc/data -n %s --dry-run\n%s", ns, dry)
	for _, want := range []string{"would scale deployment/app from 1 to 0 replicas", "would delete claim " + ns + "/data", "would create PV " + oldPV + "-spindle",
		"would scale deployment/app back to 1 replicas", "dry run: nothing was changed"} {
		if !strings.Contains(dry, want) {
			t.Errorf("the dry run does not say %q", want)
		}
	}
	if got, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{}); err != nil || got.Spec.VolumeName != oldPV {
		t.Fatalf("after the dry run the claim is %v, %v; want it on %s still", got.Spec.VolumeName, err, oldPV)
	}
	if meta := string(r.run(t, "rbd", "image-meta", "list", r.pool+"/"+image)); strings.Contains(meta, "spindle") {
		t.Fatalf("the dry run wrote Spindle's metadata: %s", meta)
	}

	if d, err := c.Client.AppsV1().Deployments(ns).Get(ctx, "app", metav1.GetOptions{}); err != nil || *d.Spec.Replicas != 1 {
		t.Fatalf("after the dry run deployment app is %v, %v; want 1 replica still", d.Spec.Replicas, err)
	}

	t0 := time.Now()
	out := c.adopt(t, "pvc/data", "-n", ns)
	took := time.Since(t0)
	t.Logf("$ kubectl spindle adopt pvc/data -n %s   (took %s)\n%s", ns, took.Round(100*time.Millisecond), out)
	got, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
	if err != nil || got.Status.Phase != corev1.ClaimBound || got.Spec.VolumeName != oldPV+"-spindle" {
		t.Fatalf("after adopt the claim is %+v, %v; want it bound to %s-spindle", got.Status, err, oldPV)
	}
	newPV, err := c.Client.CoreV1().PersistentVolumes().Get(ctx, oldPV+"-spindle", metav1.GetOptions{})
	if err != nil || newPV.Spec.CSI.Driver != driverName || newPV.Spec.StorageClassName != class {
		t.Fatalf("the new PV: %+v, %v", newPV, err)
	}
	if _, err := c.Client.CoreV1().PersistentVolumes().Get(ctx, oldPV, metav1.GetOptions{}); err == nil {
		t.Fatalf("the ceph-csi PV %s is still there", oldPV)
	}

	// The workload is back, on Spindle's PV; then it stops, and a pod
	// reads the data.
	c.WaitFor(t, "the pod of deployment app Running on the adopted claim", func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=app"})
		return err == nil && len(pods.Items) == 1 && pods.Items[0].Status.Phase == corev1.PodRunning, err
	})
	if _, err := c.Client.AppsV1().Deployments(ns).Patch(ctx, "app", types.MergePatchType, []byte(`{"spec":{"replicas":0}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	c.WaitFor(t, "deployment app scaled to 0", func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=app"})
		return err == nil && len(pods.Items) == 0, err
	})
	c.Pod(t, ns, "reader", "data", kube.PodOptions{Block: true, Args: []string{"verify-block", "/dev/xvda", strconv.Itoa(dataBytes)}})
	reader := c.WaitPod(t, ns, "reader", corev1.PodSucceeded)
	if msg := kube.TerminationMessage(reader); msg != "verified "+wrote {
		t.Fatalf("the pod on the adopted claim says %q, want verified %s", msg, wrote)
	}
	if n := r.dataObjects(t, image); n != objects {
		t.Fatalf("the image has %d data objects after the adoption, %d before: it was copied or written", n, objects)
	}
	c.DeletePod(t, ns, "reader")

	// A snapshot of the adopted volume (Rook's VolumeSnapshotClass), restored.
	c.snapshot(t, ns, "snap", snapClass, "data")
	group := "snapshot.storage.k8s.io"
	c.Claim(t, ns, "restored", kube.ClaimOptions{StorageClass: class, Block: true, DataSource: &corev1.TypedLocalObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "snap"}})
	c.Pod(t, ns, "restored-reader", "restored", kube.PodOptions{Block: true, Args: []string{"verify-block", "/dev/xvda", strconv.Itoa(dataBytes)}})
	if msg := kube.TerminationMessage(c.WaitPod(t, ns, "restored-reader", corev1.PodSucceeded)); msg != "verified "+wrote {
		t.Fatalf("the pod on the restored snapshot says %q, want verified %s", msg, wrote)
	}
	t.Logf("adopted image %s/%s in %s (deployment app scaled 1 -> 0 -> 1; %d data objects before and after; %d MiB read back in a pod); snapshot restored with the same data", r.pool, image, took.Round(100*time.Millisecond), objects, dataBytes>>20)
}

// adopt runs `kubectl spindle adopt ARGS` (the controller at
// SPINDLE_E2E_CONTROLLER_URL, which requireRookCeph requires) and returns
// what it printed; it must succeed.
func (c *cluster) adopt(t *testing.T, args ...string) string {
	t.Helper()
	out, code := c.spindle(t, "", append([]string{"adopt"}, args...)...)
	if code != 0 {
		t.Fatalf("kubectl spindle adopt %v: exit %d\n%s", args, code, out)
	}
	return out
}

// appOn is a Deployment of one pod (the e2e image, pausing) on this
// node with claim as a block device.
func appOn(c *cluster, ns, name, claim string) *appsv1.Deployment {
	one, grace, noToken := int32(1), int64(1), false
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeName: c.Node, HostNetwork: true, TerminationGracePeriodSeconds: &grace, AutomountServiceAccountToken: &noToken,
					Containers: []corev1.Container{{
						Name: "e2e", Image: c.PodImage, ImagePullPolicy: corev1.PullIfNotPresent, Args: []string{"pause"},
						VolumeDevices: []corev1.VolumeDevice{{Name: "data", DevicePath: "/dev/xvda"}},
					}},
					Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
						PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
					}}},
				},
			},
		},
	}
}

// rookClass reads one of Rook's example classes (internal/backend/rbd/
// testdata: Rook's files with only the provisioner changed) into v.
func rookClass(t *testing.T, file string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "internal", "backend", "rbd", "testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// rookClasses creates Rook's example StorageClass and VolumeSnapshotClass
// (testdata: Rook's files with only the provisioner changed) and deletes
// them when the test ends; it returns their names.
func rookClasses(t *testing.T, c *cluster) (class, snapshotClass string) {
	t.Helper()
	ctx := context.Background()
	var sc storagev1.StorageClass
	rookClass(t, "rook-storageclass.yaml", &sc)
	if _, err := c.Client.StorageV1().StorageClasses().Create(ctx, &sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.StorageV1().StorageClasses().Delete(context.Background(), sc.Name, metav1.DeleteOptions{})
	})
	var vsc map[string]any
	rookClass(t, "rook-snapshotclass.yaml", &vsc)
	name, _, _ := unstructured.NestedString(vsc, "metadata", "name")
	if _, err := c.Dynamic.Resource(kube.VolumeSnapshotClasses).Create(ctx, &unstructured.Unstructured{Object: vsc}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Dynamic.Resource(kube.VolumeSnapshotClasses).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return sc.Name, name
}

// rookNamespace creates Rook's namespace with Rook's two secrets, shaped
// as Rook creates them (userID, userKey; here the admin user), and
// deletes it when the test ends. Called before the test's own namespace,
// so that it goes after the claims that need its secrets to be deleted.
func (r rookCeph) rookNamespace(t *testing.T, c *cluster) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "rook-ceph"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace rook-ceph: %v", err)
	}
	t.Cleanup(func() {
		// Gone before the next test makes it again.
		_ = c.Client.CoreV1().Namespaces().Delete(context.Background(), "rook-ceph", metav1.DeleteOptions{})
		c.WaitFor(t, "namespace rook-ceph gone", func(ctx context.Context) (bool, error) {
			_, err := c.Client.CoreV1().Namespaces().Get(ctx, "rook-ceph", metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
	})
	key := r.adminKey(t)
	for _, name := range []string{"rook-csi-rbd-provisioner", "rook-csi-rbd-node"} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "rook-ceph"}, StringData: map[string]string{"userID": "admin", "userKey": key}}
		if _, err := c.Client.CoreV1().Secrets("rook-ceph").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMonitorMoveNeedsNoRestart (one node): Rook's example StorageClass
// and VolumeSnapshotClass, unchanged but for the provisioner, with Rook's
// secrets; a claim of the class is written, snapshotted. Then the cluster
// map the driver reads (the file Rook's ConfigMap becomes) names an
// address where no monitor listens: a new claim does not provision. The
// map is rewritten to the monitor's other address (msgr1), as kubelet
// rewrites the ConfigMap when Rook moves a monitor: the same claim then
// provisions and mounts, and the snapshot restores, with the driver
// process never restarted (its process_start_time_seconds the same). (TestRookStorageClassUnchanged runs PostgreSQL
// across such a move.)
func TestMonitorMoveNeedsNoRestart(t *testing.T) {
	r, c, m := requireClusterMap(t)
	started := c.ControllerStartTime(t)
	r.rookNamespace(t, c)
	class, vscName := rookClasses(t, c)
	ns := c.Namespace(t)
	ctx := context.Background()

	c.Claim(t, ns, "before", kube.ClaimOptions{StorageClass: class})
	wrote := c.writeFile(t, ns, "writer", "before")
	c.DeletePod(t, ns, "writer")
	c.snapshot(t, ns, "snap", vscName, "before")

	// The map, rewritten in place (a new file renamed over it, as kubelet
	// swaps a ConfigMap volume's data).
	moveMonitor := m.rewrite(t)
	moveMonitor("127.0.0.1:1")
	mode := corev1.PersistentVolumeFilesystem
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "after", Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &class, VolumeMode: &mode,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var failure string
	c.WaitFor(t, "provisioning of claim after to fail while the map names no monitor", func(ctx context.Context) (bool, error) {
		evs, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=after,reason=ProvisioningFailed"})
		if err != nil || len(evs.Items) == 0 {
			return false, err
		}
		failure = evs.Items[0].Message
		return true, nil
	})
	t.Logf("with the map naming 127.0.0.1:1: %s", failure)
	// A monitor that never answers is the cluster out of reach
	// (UNAVAILABLE, which the provisioner retries), named (stopped by
	// librados's own connect timeout or the driver's per-call limit,
	// whichever ends first).
	if !strings.Contains(failure, "Unavailable") || !strings.Contains(failure, "no monitor of 127.0.0.1:1 answered") {
		t.Fatalf("provisioning with the map naming no monitor failed with %q; want Unavailable saying no monitor of 127.0.0.1:1 answered", failure)
	}
	moveMonitor(m.movedTo)
	c.WaitFor(t, "claim after bound once the map names "+m.movedTo, func(ctx context.Context) (bool, error) {
		got, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "after", metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.ClaimBound, err
	})
	c.Pod(t, ns, "new-writer", "after", kube.PodOptions{Args: []string{"write", "/data/file", dataSize}})
	c.WaitPod(t, ns, "new-writer", corev1.PodRunning)
	group := "snapshot.storage.k8s.io"
	c.Claim(t, ns, "restored", kube.ClaimOptions{StorageClass: class, DataSource: &corev1.TypedLocalObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "snap"}})
	c.Pod(t, ns, "reader", "restored", kube.PodOptions{Args: []string{"verify", "/data/file"}})
	if msg := kube.TerminationMessage(c.WaitPod(t, ns, "reader", corev1.PodSucceeded)); msg != "verified "+wrote {
		t.Fatalf("the reader of the restored snapshot says %q, want verified %s", msg, wrote)
	}
	if now := c.ControllerStartTime(t); now != started {
		t.Fatalf("the driver's process_start_time_seconds is %.2f, was %.2f: it was restarted", now, started)
	}
	t.Logf("the driver process (started at %.2f) throughout: a claim provisioned and mounted after the map moved the monitor to %s; Rook's snapshot class restored the data", started, m.movedTo)
}
