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
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/e2e/kube"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
)

const (
	driverName = kube.DriverName
	podImage   = kube.PodImage
)

// cluster is the running local cluster the tests use: the shared client
// and steps (e2e/kube), and what only this one-node cluster on this
// machine has (its directories, mount table and logs).
type cluster struct {
	*kube.Cluster
}

// nodeMetricsAddress is where the node plugin serves /volumes: both
// deployments of hack/local-cluster use 127.0.0.1:9808.
func (c *cluster) nodeMetricsAddress() string { return "127.0.0.1:9808" }

// kubeletDir is kubelet's --root-dir; poolDir the driver's loop pool.
func (c *cluster) kubeletDir() string { return filepath.Join(c.Dir, "kubelet") }
func (c *cluster) poolDir() string    { return filepath.Join(c.Dir, "pool") }
func (c *cluster) csiSocket() string {
	return filepath.Join(c.kubeletDir(), "plugins", driverName, "csi.sock")
}

func connect(t *testing.T) *cluster {
	t.Helper()
	node := os.Getenv("SPINDLE_E2E_NODE")
	if node == "" {
		node = "spindle-local-node"
	}
	return &cluster{kube.Connect(t, node)}
}

// controllerSocket is the socket of the driver's controller service: the
// host process's (DEPLOY=process), or the controller pod's socket
// directory, an emptyDir kubelet keeps under the pod's directory (DEPLOY=helm).
func (c *cluster) controllerSocket(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(filepath.Join(c.Dir, "logs", "spindle.log")); err == nil {
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
	if data, err := os.ReadFile(filepath.Join(c.Dir, "logs", "spindle.log")); err == nil {
		lines = strings.Split(string(data), "\n")
	}
	containerLogs, _ := filepath.Glob(filepath.Join(c.Dir, "podlogs", "*", "spindle", "*.log"))
	for _, path := range containerLogs {
		lines = append(lines, containerLogLines(t, path)...)
	}
	if len(lines) == 0 {
		t.Fatalf("no driver log in %s", c.Dir)
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
