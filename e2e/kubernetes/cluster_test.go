// Package kubernetes holds Spindle's end-to-end tests against a real
// Kubernetes: kube-apiserver, controllers, a real kubelet, the CSI sidecars
// and the driver, on this machine (hack/local-cluster). They drive the
// driver only through Kubernetes objects (PVCs, Pods, VolumeSnapshots) and
// check what users and operators see: PV handles, VolumeAttachments, the
// kubelet's mounts, the data in the pods.
//
// `make e2e` brings a cluster up, runs them and brings it down. Without a
// cluster (SPINDLE_E2E_CLUSTER_DIR unset) every test skips, saying so.
package kubernetes

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	driverName = "spindle.csi.dev"
	podImage   = "local.test/spindle-e2e-pod:1"
	// timeout bounds every wait; the steps take seconds here.
	timeout = 3 * time.Minute
)

// cluster is the running local cluster the tests use.
type cluster struct {
	dir     string // CLUSTER_DIR of hack/local-cluster
	node    string // the node with a kubelet
	client  kubernetes.Interface
	dynamic dynamic.Interface
}

// nodeMetricsAddress is where the node plugin serves /volumes: both
// deployments of hack/local-cluster use 127.0.0.1:9808.
func (c *cluster) nodeMetricsAddress() string { return "127.0.0.1:9808" }

// kubeletDir is kubelet's --root-dir; poolDir the driver's loop pool.
func (c *cluster) kubeletDir() string { return filepath.Join(c.dir, "kubelet") }
func (c *cluster) poolDir() string    { return filepath.Join(c.dir, "pool") }
func (c *cluster) csiSocket() string {
	return filepath.Join(c.kubeletDir(), "plugins", driverName, "csi.sock")
}

func connect(t *testing.T) *cluster {
	t.Helper()
	dir := os.Getenv("SPINDLE_E2E_CLUSTER_DIR")
	if dir == "" {
		t.Skip("no Kubernetes cluster: run `make e2e`, or hack/local-cluster/up.sh and set SPINDLE_E2E_CLUSTER_DIR")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.kubeconfig"))
	if err != nil {
		t.Fatalf("kubeconfig of the cluster in %s: %v", dir, err)
	}
	c := &cluster{dir: dir, node: os.Getenv("SPINDLE_E2E_NODE")}
	if c.node == "" {
		c.node = "spindle-local-node"
	}
	if c.client, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if c.dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.client.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{}); err != nil {
		t.Fatalf("cluster in %s is not reachable or has no node %s: %v", dir, c.node, err)
	}
	return c
}

// namespace creates a namespace for one test and deletes it, with
// everything in it, when the test ends; the test's PVs must be gone too.
func (c *cluster) namespace(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	name := "e2e-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 63 {
		name = name[:63]
	}
	name = strings.TrimRight(name, "-")
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		// Pods first (their volumes detach), then the claims (their
		// volumes are deleted), then the namespace.
		zero := int64(0)
		_ = c.client.CoreV1().Pods(name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		c.waitFor(t, "pods of "+name+" gone", func(ctx context.Context) (bool, error) {
			l, err := c.client.CoreV1().Pods(name).List(ctx, metav1.ListOptions{})
			return err == nil && len(l.Items) == 0, err
		})
		_ = c.client.CoreV1().PersistentVolumeClaims(name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		c.waitFor(t, "volumes of "+name+" deleted", func(ctx context.Context) (bool, error) {
			l, err := c.client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
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
		_ = c.client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	})
	return name
}

// waitFor polls cond until it holds, failing the test after timeout.
func (c *cluster) waitFor(t *testing.T, what string, cond func(context.Context) (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		if err != nil {
			last = err
		}
		return ok, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v (last error: %v)", what, err, last)
	}
}

type claimOptions struct {
	storageClass string
	size         string
	block        bool
	accessMode   corev1.PersistentVolumeAccessMode
	dataSource   *corev1.TypedLocalObjectReference
}

// claim creates a PVC and waits until it is bound; it returns the claim and its PV.
func (c *cluster) claim(t *testing.T, ns, name string, o claimOptions) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
	t.Helper()
	ctx := context.Background()
	if o.storageClass == "" {
		o.storageClass = "spindle-ext4"
	}
	if o.size == "" {
		o.size = "1Gi"
	}
	if o.accessMode == "" {
		o.accessMode = corev1.ReadWriteOnce
	}
	mode := corev1.PersistentVolumeFilesystem
	if o.block {
		mode = corev1.PersistentVolumeBlock
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{o.accessMode},
			StorageClassName: &o.storageClass,
			VolumeMode:       &mode,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(o.size)}},
			DataSource:       o.dataSource,
		},
	}
	if _, err := c.client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create PVC %s: %v", name, err)
	}
	c.waitFor(t, "PVC "+name+" Bound", func(ctx context.Context) (bool, error) {
		got, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pvc = got
		return got.Status.Phase == corev1.ClaimBound, nil
	})
	pv, err := c.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("PV of %s: %v", name, err)
	}
	return pvc, pv
}

type podOptions struct {
	node  string // defaults to the kubelet's node
	args  []string
	block bool // the claim is attached as a device at /dev/xvda
}

// pod starts a pod that mounts claim at /data (or gets it at /dev/xvda) and
// runs the e2e image with args; hostNetwork, since the node has no pod network.
func (c *cluster) pod(t *testing.T, ns, name, claim string, o podOptions) *corev1.Pod {
	t.Helper()
	if o.node == "" {
		o.node = c.node
	}
	container := corev1.Container{
		Name: "e2e", Image: podImage, ImagePullPolicy: corev1.PullNever, Args: o.args,
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	}
	if o.block {
		container.VolumeDevices = []corev1.VolumeDevice{{Name: "data", DevicePath: "/dev/xvda"}}
	} else {
		container.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	}
	grace := int64(1)
	noToken := false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:                      o.node,
			HostNetwork:                   true,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &noToken,
			Containers:                    []corev1.Container{container},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
			}}},
		},
	}
	created, err := c.client.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	return created
}

// waitPod waits for the pod to reach phase and returns it; a pod that
// reaches a final phase other than the one wanted fails the test with its
// termination message.
func (c *cluster) waitPod(t *testing.T, ns, name string, phase corev1.PodPhase) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	c.waitFor(t, fmt.Sprintf("pod %s %s", name, phase), func(ctx context.Context) (bool, error) {
		got, err := c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = got
		if got.Status.Phase != phase && (got.Status.Phase == corev1.PodSucceeded || got.Status.Phase == corev1.PodFailed) {
			return false, fmt.Errorf("pod %s ended %s: %s", name, got.Status.Phase, terminationMessage(got))
		}
		return got.Status.Phase == phase, nil
	})
	return pod
}

func terminationMessage(pod *corev1.Pod) string {
	for _, s := range pod.Status.ContainerStatuses {
		if s.State.Terminated != nil {
			return strings.TrimSpace(s.State.Terminated.Message)
		}
	}
	return ""
}

// deletePod deletes a pod and waits until it is gone.
func (c *cluster) deletePod(t *testing.T, ns, name string) {
	t.Helper()
	if err := c.client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete pod %s: %v", name, err)
	}
	c.waitFor(t, "pod "+name+" gone", func(ctx context.Context) (bool, error) {
		_, err := c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// attachment waits for the VolumeAttachment of pv on node to satisfy cond.
func (c *cluster) attachment(t *testing.T, pv, node string, what string, cond func(*storagev1.VolumeAttachment) bool) *storagev1.VolumeAttachment {
	t.Helper()
	var va *storagev1.VolumeAttachment
	c.waitFor(t, fmt.Sprintf("VolumeAttachment of %s on %s %s", pv, node, what), func(ctx context.Context) (bool, error) {
		l, err := c.client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for i := range l.Items {
			a := &l.Items[i]
			if a.Spec.Attacher == driverName && a.Spec.NodeName == node && a.Spec.Source.PersistentVolumeName != nil && *a.Spec.Source.PersistentVolumeName == pv {
				va = a
				return cond(a), nil
			}
		}
		return false, nil
	})
	return va
}

// attachmentsOf lists the VolumeAttachments of a PV.
func (c *cluster) attachmentsOf(ctx context.Context, pv string) ([]storagev1.VolumeAttachment, error) {
	l, err := c.client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
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

// controllerSocket is the socket of the driver's controller service: the
// host process's (DEPLOY=process), or the controller pod's socket
// directory, an emptyDir kubelet keeps under the pod's directory (DEPLOY=helm).
func (c *cluster) controllerSocket(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(filepath.Join(c.dir, "logs", "spindle.log")); err == nil {
		return c.csiSocket()
	}
	sockets, _ := filepath.Glob(filepath.Join(c.kubeletDir(), "pods/*/volumes/kubernetes.io~empty-dir/socket-dir/csi.sock"))
	if len(sockets) != 1 {
		t.Fatalf("controller sockets under %s: %v, want one", c.kubeletDir(), sockets)
	}
	// The path is longer than a socket address may be (108 bytes); a short
	// symlink reaches the same socket.
	link := filepath.Join(t.TempDir(), "controller.sock")
	if err := os.Symlink(sockets[0], link); err != nil {
		t.Fatal(err)
	}
	return link
}

// csiClient talks to the driver's controller socket, as the sidecars do, so
// a test can compare what Kubernetes shows with what the driver answers.
func (c *cluster) csiClient(t *testing.T) csi.ControllerClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+c.controllerSocket(t), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return csi.NewControllerClient(conn)
}

// stagingPath is where kubelet stages a CSI PV on this node.
func (c *cluster) stagingPath(pv *corev1.PersistentVolume) string {
	sum := sha256.Sum256([]byte(pv.Spec.CSI.VolumeHandle))
	return filepath.Join(c.kubeletDir(), "plugins/kubernetes.io/csi", driverName, hex.EncodeToString(sum[:]), "globalmount")
}

// podVolumeDir is where kubelet publishes a filesystem PV into a pod.
func (c *cluster) podVolumeDir(pod *corev1.Pod, pv string) string {
	return filepath.Join(c.kubeletDir(), "pods", string(pod.UID), "volumes/kubernetes.io~csi", pv, "mount")
}

// mount is one line of /proc/self/mountinfo.
type mount struct {
	source, mountPoint, fsType, root string
}

func mounts(t *testing.T) []mount {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []mount
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		sep := 0
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep == 0 || len(fields) < sep+3 {
			continue
		}
		out = append(out, mount{root: fields[3], mountPoint: unescape(fields[4]), fsType: fields[sep+1], source: fields[sep+2]})
	}
	return out
}

func unescape(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// mountsAt returns the mounts whose mount point is path.
func mountsAt(t *testing.T, path string) []mount {
	var out []mount
	for _, m := range mounts(t) {
		if m.mountPoint == path {
			out = append(out, m)
		}
	}
	return out
}

// driverLog returns the driver's log entries (JSON lines) that match every
// key=value in match: from the host process's log (DEPLOY=process) or from
// the logs kubelet keeps of the driver's containers (DEPLOY=helm).
func (c *cluster) driverLog(t *testing.T, match map[string]string) []map[string]any {
	t.Helper()
	var lines []string
	if data, err := os.ReadFile(filepath.Join(c.dir, "logs", "spindle.log")); err == nil {
		lines = strings.Split(string(data), "\n")
	}
	containerLogs, _ := filepath.Glob(filepath.Join(c.dir, "podlogs", "*", "spindle", "*.log"))
	for _, path := range containerLogs {
		lines = append(lines, containerLogLines(t, path)...)
	}
	if len(lines) == 0 {
		t.Fatalf("no driver log in %s", c.dir)
	}
	var out []map[string]any
	for _, line := range lines {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("driver log line %q: %v", line, err)
		}
		ok := true
		for k, v := range match {
			if fmt.Sprint(e[k]) != v {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, e)
		}
	}
	return out
}

// containerLogLines reads a CRI container log ("<time> <stream> <P|F>
// <text>" per line, P marking a line continued in the next entry) back
// into the lines the container wrote.
func containerLogLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	var partial strings.Builder
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		fields := strings.SplitN(s.Text(), " ", 4)
		if len(fields) < 4 {
			continue
		}
		partial.WriteString(fields[3])
		if fields[2] == "F" {
			out = append(out, partial.String())
			partial.Reset()
		}
	}
	return out
}

// imagePath is the loop image file behind a PV.
func (c *cluster) imagePath(pv *corev1.PersistentVolume) string {
	parts := strings.Split(pv.Spec.CSI.VolumeHandle, "/")
	return filepath.Join(c.poolDir(), parts[len(parts)-1]+".img")
}

// loopDevicesOf lists the loop devices backed by file.
func loopDevicesOf(t *testing.T, file string) []string {
	t.Helper()
	matches, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, m := range matches {
		data, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		if strings.TrimSuffix(strings.TrimSpace(string(data)), " (deleted)") == file {
			out = append(out, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(m))))
		}
	}
	return out
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
