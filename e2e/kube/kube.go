// Package kube is what Spindle's Kubernetes end-to-end tests share: a
// client of the cluster under test and the steps every test takes through
// the API (a namespace per test, claims, pods, VolumeAttachments), with
// waits that fail the test after Timeout. The tests observe through the API
// server, so they run unchanged on the local cluster, kind or a real one.
package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	DriverName = "spindle.csi.dev"
	// Timeout bounds every wait; the steps take seconds on this machine,
	// tens of seconds on emulated worker nodes.
	Timeout = 3 * time.Minute
)

// The environment that says which cluster the tests run against and what
// they use there. Only a kubeconfig is needed; the rest has defaults that
// match the local cluster, the kind cluster and the chart's default values.
const (
	// EnvKubeconfig is the kubeconfig of the cluster under test.
	EnvKubeconfig = "SPINDLE_E2E_KUBECONFIG"
	// EnvClusterDir is hack/local-cluster's directory; its admin.kubeconfig
	// is used when EnvKubeconfig is not set.
	EnvClusterDir = "SPINDLE_E2E_CLUSTER_DIR"
	// EnvStorageClass is an ext4 StorageClass of Spindle's loop backend
	// (default spindle-ext4), EnvXFSStorageClass an xfs one that allows
	// expansion (spindle-xfs), EnvSnapshotClass a VolumeSnapshotClass of
	// the driver (spindle).
	EnvStorageClass    = "SPINDLE_E2E_STORAGE_CLASS"
	EnvXFSStorageClass = "SPINDLE_E2E_XFS_STORAGE_CLASS"
	EnvSnapshotClass   = "SPINDLE_E2E_SNAPSHOT_CLASS"
	// EnvPodImage is e2e/cmd/spindle-e2e-pod's image, present on the nodes
	// or pullable (default local.test/spindle-e2e-pod:1).
	EnvPodImage = "SPINDLE_E2E_POD_IMAGE"
	// EnvNodeAddress and EnvControllerURL reach a driver that does not run
	// in the chart's pods (hack/local-cluster's DEPLOY=process): the node
	// plugin's endpoints as NODE=HOST:PORT, the controller's as a URL. Without
	// them the tests reach both through the API server's pod proxy.
	EnvNodeAddress   = "SPINDLE_E2E_NODE_ADDRESS"
	EnvControllerURL = "SPINDLE_E2E_CONTROLLER_URL"
)

// Cluster is a running cluster the tests use.
type Cluster struct {
	Kubeconfig string // the kubeconfig file, for the tools the tests run
	Node       string // the default node for pods
	Config     *rest.Config
	Client     kubernetes.Interface
	Dynamic    dynamic.Interface

	StorageClass, XFSStorageClass, SnapshotClass string
	PodImage                                     string
	// nodeAddresses and controllerURL are EnvNodeAddress and EnvControllerURL.
	nodeAddresses map[string]string
	controllerURL string
}

// Connect returns the cluster of EnvKubeconfig (or EnvClusterDir), checking
// that node exists; without either variable the test fails, saying how to
// get a cluster.
func Connect(t testing.TB, node string) *Cluster {
	t.Helper()
	kubeconfig := os.Getenv(EnvKubeconfig)
	if kubeconfig == "" && os.Getenv(EnvClusterDir) != "" {
		kubeconfig = filepath.Join(os.Getenv(EnvClusterDir), "admin.kubeconfig")
	}
	if kubeconfig == "" {
		t.Fatalf("no Kubernetes cluster: run `make e2e` or `make e2e-kind`, or set %s (docs/testing.md)", EnvKubeconfig)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", kubeconfig, err)
	}
	// Subtests that run at once poll the API server every 250 ms each:
	// client-go's default 5 requests a second made them wait on the
	// client's own rate limiter until their deadlines passed.
	cfg.QPS, cfg.Burst = 50, 100
	c := &Cluster{
		Kubeconfig: kubeconfig, Node: node, Config: cfg,
		StorageClass:    envOr(EnvStorageClass, "spindle-ext4"),
		XFSStorageClass: envOr(EnvXFSStorageClass, "spindle-xfs"),
		SnapshotClass:   envOr(EnvSnapshotClass, "spindle"),
		PodImage:        envOr(EnvPodImage, "local.test/spindle-e2e-pod:1"),
		nodeAddresses:   map[string]string{},
		controllerURL:   os.Getenv(EnvControllerURL),
	}
	for _, pair := range strings.Fields(strings.ReplaceAll(os.Getenv(EnvNodeAddress), ",", " ")) {
		name, addr, ok := strings.Cut(pair, "=")
		if !ok {
			t.Fatalf("%s=%q: want NODE=HOST:PORT[,...]", EnvNodeAddress, os.Getenv(EnvNodeAddress))
		}
		c.nodeAddresses[name] = addr
	}
	if c.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if c.Dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Client.CoreV1().Nodes().Get(ctx, c.Node, metav1.GetOptions{}); err != nil {
		t.Fatalf("the cluster of %s is not reachable or has no node %s: %v", kubeconfig, c.Node, err)
	}
	return c
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// NodeAddressFlags are kubectl-spindle's --node-address and
// --controller-url flags for a driver outside the chart's pods
// (EnvNodeAddress, EnvControllerURL); none when it runs in them, which
// kubectl-spindle then finds by itself.
func (c *Cluster) NodeAddressFlags() []string {
	var out []string
	for node, addr := range c.nodeAddresses {
		out = append(out, "--node-address", node+"="+addr)
	}
	if c.controllerURL != "" {
		out = append(out, "--controller-url", c.controllerURL)
	}
	return out
}

// NeedClass skips the test when the cluster has no StorageClass (or, with
// snapshot, VolumeSnapshotClass) named name, saying which.
func (c *Cluster) NeedClass(t testing.TB, name string, snapshot bool) {
	t.Helper()
	ctx := context.Background()
	var err error
	if snapshot {
		_, err = c.Dynamic.Resource(VolumeSnapshotClasses).Get(ctx, name, metav1.GetOptions{})
	} else {
		_, err = c.Client.StorageV1().StorageClasses().Get(ctx, name, metav1.GetOptions{})
	}
	switch {
	case apierrors.IsNotFound(err) && snapshot:
		t.Skipf("the cluster has no VolumeSnapshotClass %s (set %s)", name, EnvSnapshotClass)
	case apierrors.IsNotFound(err):
		t.Skipf("the cluster has no StorageClass %s (set %s or %s)", name, EnvStorageClass, EnvXFSStorageClass)
	case err != nil:
		t.Fatal(err)
	}
}

// Namespace creates a namespace for one test and deletes it, with
// everything in it, when the test ends; the test's PVs must be gone too.
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	name := "e2e-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 63 {
		name = name[:63]
	}
	name = strings.TrimRight(name, "-")
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		// Pods first (their volumes detach), then the claims (their
		// volumes are deleted), then the namespace.
		zero := int64(0)
		_ = c.Client.CoreV1().Pods(name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		c.WaitFor(t, "pods of "+name+" gone", func(ctx context.Context) (bool, error) {
			l, err := c.Client.CoreV1().Pods(name).List(ctx, metav1.ListOptions{})
			return err == nil && len(l.Items) == 0, err
		})
		_ = c.Client.CoreV1().PersistentVolumeClaims(name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		c.WaitFor(t, "volumes of "+name+" deleted", func(ctx context.Context) (bool, error) {
			l, err := c.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			for _, pv := range l.Items {
				if ref := pv.Spec.ClaimRef; ref != nil && ref.Namespace == name {
					return false, nil
				}
			}
			return true, nil
		})
		_ = c.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	})
	return name
}

// WaitFor polls cond until it holds, failing the test after Timeout.
func (c *Cluster) WaitFor(t testing.TB, what string, cond func(context.Context) (bool, error)) {
	t.Helper()
	c.WaitForWithin(t, what, Timeout, cond)
}

// WaitForWithin is WaitFor for a step that takes longer than Timeout (a
// node that must be declared lost, a database that must recover).
func (c *Cluster) WaitForWithin(t testing.TB, what string, timeout time.Duration, cond func(context.Context) (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		// The poll's own deadline fails the last call too; keep the error
		// before it, which says what the wait was waiting on.
		if err != nil && (last == nil || ctx.Err() == nil) {
			last = err
		}
		return ok, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v (last error: %v)", what, err, last)
	}
}

// The snapshot API's resources (snapshot.storage.k8s.io/v1).
var (
	VolumeSnapshots       = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	VolumeSnapshotClasses = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotclasses"}
)

type ClaimOptions struct {
	StorageClass string // default the cluster's StorageClass
	Size         string // default 1Gi
	Block        bool
	AccessMode   corev1.PersistentVolumeAccessMode // default ReadWriteOnce
	DataSource   *corev1.TypedLocalObjectReference
}

// Claim creates a PVC and waits until it is bound; it returns the claim and its PV.
func (c *Cluster) Claim(t testing.TB, ns, name string, o ClaimOptions) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
	t.Helper()
	ctx := context.Background()
	if o.StorageClass == "" {
		o.StorageClass = c.StorageClass
	}
	if o.Size == "" {
		o.Size = "1Gi"
	}
	if o.AccessMode == "" {
		o.AccessMode = corev1.ReadWriteOnce
	}
	mode := corev1.PersistentVolumeFilesystem
	if o.Block {
		mode = corev1.PersistentVolumeBlock
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{o.AccessMode},
			StorageClassName: &o.StorageClass,
			VolumeMode:       &mode,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(o.Size)}},
			DataSource:       o.DataSource,
		},
	}
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create PVC %s: %v", name, err)
	}
	c.WaitFor(t, "PVC "+name+" Bound", func(ctx context.Context) (bool, error) {
		got, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pvc = got
		return got.Status.Phase == corev1.ClaimBound, nil
	})
	pv, err := c.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("PV of %s: %v", name, err)
	}
	return pvc, pv
}

type PodOptions struct {
	Node  string // defaults to the cluster's node
	Args  []string
	Block bool // the claim is attached as a device at /dev/xvda
	// HostPID: the pod sees and may signal the node's processes
	// (privileged, in the host's PID namespace).
	HostPID bool
}

// Pod starts a pod that mounts claim at /data (or gets it at /dev/xvda; no
// volume when claim is "") and runs the e2e image with args; hostNetwork,
// since the local cluster's own node has no pod network that reaches
// beyond it (its worker guests do).
func (c *Cluster) Pod(t testing.TB, ns, name, claim string, o PodOptions) *corev1.Pod {
	t.Helper()
	if o.Node == "" {
		o.Node = c.Node
	}
	container := corev1.Container{
		Name: "e2e", Image: c.PodImage, ImagePullPolicy: corev1.PullIfNotPresent, Args: o.Args,
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	}
	var volumes []corev1.Volume
	switch {
	case claim == "":
	case o.Block:
		container.VolumeDevices = []corev1.VolumeDevice{{Name: "data", DevicePath: "/dev/xvda"}}
	default:
		container.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	}
	if claim != "" {
		volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
		}}}
	}
	if o.HostPID {
		privileged := true
		container.SecurityContext = &corev1.SecurityContext{Privileged: &privileged}
	}
	grace := int64(1)
	noToken := false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:                      o.Node,
			HostNetwork:                   true,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &noToken,
			HostPID:                       o.HostPID,
			Containers:                    []corev1.Container{container},
			Volumes:                       volumes,
		},
	}
	created, err := c.Client.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	return created
}

// WaitPod waits for the pod to reach phase and returns it; a pod that
// reaches a final phase other than the one wanted fails the test with its
// termination message.
func (c *Cluster) WaitPod(t testing.TB, ns, name string, phase corev1.PodPhase) *corev1.Pod {
	t.Helper()
	return c.WaitPodWithin(t, ns, name, phase, Timeout)
}

// WaitPodWithin is WaitPod for a pod that may take longer than Timeout.
func (c *Cluster) WaitPodWithin(t testing.TB, ns, name string, phase corev1.PodPhase, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	c.WaitForWithin(t, fmt.Sprintf("pod %s %s", name, phase), timeout, func(ctx context.Context) (bool, error) {
		got, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = got
		if got.Status.Phase != phase && (got.Status.Phase == corev1.PodSucceeded || got.Status.Phase == corev1.PodFailed) {
			return false, fmt.Errorf("pod %s ended %s: %s", name, got.Status.Phase, TerminationMessage(got))
		}
		return got.Status.Phase == phase, nil
	})
	return pod
}

func TerminationMessage(pod *corev1.Pod) string {
	for _, s := range pod.Status.ContainerStatuses {
		if s.State.Terminated != nil {
			return strings.TrimSpace(s.State.Terminated.Message)
		}
	}
	return ""
}

// DeletePod deletes a pod and waits until it is gone.
func (c *Cluster) DeletePod(t testing.TB, ns, name string) {
	t.Helper()
	if err := c.Client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete pod %s: %v", name, err)
	}
	c.WaitFor(t, "pod "+name+" gone", func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// Attachment waits for the VolumeAttachment of pv on node to satisfy cond.
func (c *Cluster) Attachment(t testing.TB, pv, node string, what string, cond func(*storagev1.VolumeAttachment) bool) *storagev1.VolumeAttachment {
	t.Helper()
	var va *storagev1.VolumeAttachment
	c.WaitFor(t, fmt.Sprintf("VolumeAttachment of %s on %s %s", pv, node, what), func(ctx context.Context) (bool, error) {
		l, err := c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for i := range l.Items {
			a := &l.Items[i]
			if a.Spec.Attacher == DriverName && a.Spec.NodeName == node && a.Spec.Source.PersistentVolumeName != nil && *a.Spec.Source.PersistentVolumeName == pv {
				va = a
				return cond(a), nil
			}
		}
		return false, nil
	})
	return va
}

// AttachmentsOf lists the VolumeAttachments of a PV.
func (c *Cluster) AttachmentsOf(ctx context.Context, pv string) ([]storagev1.VolumeAttachment, error) {
	l, err := c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []storagev1.VolumeAttachment
	for _, a := range l.Items {
		if a.Spec.Source.PersistentVolumeName != nil && *a.Spec.Source.PersistentVolumeName == pv {
			out = append(out, a)
		}
	}
	return out, nil
}

// WaitMultiAttach waits for the attach-detach controller's Multi-Attach
// event on a pod (a single-node volume that another node holds) and
// returns its message.
func (c *Cluster) WaitMultiAttach(t testing.TB, ns, pod string) string {
	t.Helper()
	var msg string
	c.WaitFor(t, "a Multi-Attach event on pod "+pod, func(ctx context.Context) (bool, error) {
		events, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == "FailedAttachVolume" && strings.Contains(e.Message, "Multi-Attach error") {
				msg = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	return msg
}
