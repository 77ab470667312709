//go:build cluster

// Package kubernetes holds Spindle's end-to-end tests against a real
// Kubernetes: kube-apiserver, controllers, real kubelets, the CSI sidecars
// and the driver. They drive the driver only through Kubernetes objects
// (PVCs, Pods, VolumeSnapshots) and check what users and operators see,
// only through the API server: PV handles, VolumeAttachments, events, the
// pods' logs and `kubectl exec` into them, kubectl-spindle, and the node
// plugin's /volumes and the controller's /images through the API server's
// pod proxy. Nothing reads the machine the tests run on (its mounts, the
// pool's files, a log file), so the same tests pass on the local cluster
// (`make e2e`), on kind (`make e2e-kind`) and on any cluster with Spindle
// (docs/testing.md). The Rook tests (rook_test.go) add a throw-away Ceph
// that `make e2e` starts on this machine, which they inspect with the Ceph
// CLIs; where the driver cannot reach it they skip, saying so.
//
// Without a cluster (SPINDLE_E2E_KUBECONFIG and SPINDLE_E2E_CLUSTER_DIR
// unset) every test skips, saying so.
package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/e2e/kube"
	"github.com/spindle-csi/spindle/internal/opsapi"

	corev1 "k8s.io/api/core/v1"
)

const (
	driverName = kube.DriverName
	// podBinary is the e2e image's one program (e2e/cmd/spindle-e2e-pod).
	podBinary = "/usr/local/bin/spindle-e2e-pod"
)

// cluster is the cluster under test: the shared client and steps
// (e2e/kube) and this package's views of the driver.
type cluster struct {
	*kube.Cluster
}

// connect connects to the cluster; SPINDLE_E2E_NODE names the node the
// pods run on (the local cluster's by default).
func connect(t *testing.T) *cluster {
	t.Helper()
	node := os.Getenv("SPINDLE_E2E_NODE")
	if node == "" {
		node = "spindle-local-node"
	}
	return &cluster{kube.Connect(t, node)}
}

// stagingSuffix is the end of the path where kubelet stages a CSI PV,
// <kubelet's root>/plugins/kubernetes.io/csi/<driver>/<sha256 of the handle>/globalmount;
// kubelet's root differs between clusters.
func stagingSuffix(pv *corev1.PersistentVolume) string {
	sum := sha256.Sum256([]byte(pv.Spec.CSI.VolumeHandle))
	return filepath.Join("/plugins/kubernetes.io/csi", driverName, hex.EncodeToString(sum[:]), "globalmount")
}

// publishSuffix is the end of the path where kubelet publishes a PV into
// a pod: <kubelet's root>/pods/<pod>/volumes/kubernetes.io~csi/<pv>/mount
// for a filesystem, <kubelet's root>/plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<pod>
// for a block volume.
func publishSuffix(pod *corev1.Pod, pv string, block bool) string {
	if block {
		return filepath.Join("/plugins/kubernetes.io/csi/volumeDevices/publish", pv, string(pod.UID))
	}
	return filepath.Join("/pods", string(pod.UID), "volumes/kubernetes.io~csi", pv, "mount")
}

// imageName is the image part of a Spindle volume handle.
func imageName(pv *corev1.PersistentVolume) string {
	h := pv.Spec.CSI.VolumeHandle
	return h[strings.LastIndex(h, "/")+1:]
}

// staged returns what the node plugin on node has staged for pv (nil if
// nothing) and the devices its backends hold for it.
func (c *cluster) staged(t *testing.T, node string, pv *corev1.PersistentVolume) (*opsapi.StagedVolume, []opsapi.AttachedDevice) {
	t.Helper()
	return stagedOf(c.NodeVolumes(t, node), pv.Spec.CSI.VolumeHandle)
}

func stagedOf(nv opsapi.NodeVolumes, handle string) (*opsapi.StagedVolume, []opsapi.AttachedDevice) {
	var staged *opsapi.StagedVolume
	for i := range nv.Staged {
		if nv.Staged[i].VolumeID == handle {
			if staged != nil {
				return nil, nil // two stage records of one volume: stagedOnce says so
			}
			staged = &nv.Staged[i]
		}
	}
	var devices []opsapi.AttachedDevice
	for _, d := range nv.Devices {
		if d.VolumeID == handle {
			devices = append(devices, d)
		}
	}
	return staged, devices
}

// stagedOnce waits until the node plugin on c.Node reports pv staged
// once and published to each of pods (kubelet reports a pod Running once
// its volumes are set up; the plugin's inventory says so from the node),
// and returns the stage and the devices the backend holds for pv. A
// filesystem volume must have no other publishes; a block volume's device
// has kubelet's own binds besides.
func (c *cluster) stagedOnce(t *testing.T, pv *corev1.PersistentVolume, pods ...*corev1.Pod) (opsapi.StagedVolume, []opsapi.AttachedDevice) {
	t.Helper()
	block := pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock
	var staged opsapi.StagedVolume
	var devices []opsapi.AttachedDevice
	c.WaitFor(t, "the node plugin's /volumes to show "+pv.Name+" staged once and published to its pods", func(ctx context.Context) (bool, error) {
		nv, err := c.TryNodeVolumes(ctx, c.Node)
		if err != nil {
			return false, err
		}
		records := 0
		for _, s := range nv.Staged {
			if s.VolumeID == pv.Spec.CSI.VolumeHandle {
				records++
				staged = s
			}
		}
		_, devices = stagedOf(nv, pv.Spec.CSI.VolumeHandle)
		if records != 1 {
			return false, fmt.Errorf("%d stage records of %s", records, pv.Name)
		}
		for _, pod := range pods {
			if !slices.ContainsFunc(staged.Publishes, func(p string) bool { return strings.HasSuffix(p, publishSuffix(pod, pv.Name, block)) }) {
				return false, fmt.Errorf("%s is published at %v, not to pod %s (.../%s)", pv.Name, staged.Publishes, pod.Name, publishSuffix(pod, pv.Name, block))
			}
		}
		if !block && len(staged.Publishes) != len(pods) {
			return false, fmt.Errorf("%s is published at %v, want only its %d pods'", pv.Name, staged.Publishes, len(pods))
		}
		return true, nil
	})
	return staged, devices
}

// image returns the controller's record of pv's image, or nil.
func (c *cluster) image(t *testing.T, pv *corev1.PersistentVolume) *opsapi.Image {
	t.Helper()
	images := c.ControllerImages(t)
	for _, b := range images.Backends {
		if b.Error != "" {
			t.Fatalf("the controller cannot list backend %s: %s", b.Backend, b.Error)
		}
		for i := range b.Images {
			if b.Images[i].VolumeID == pv.Spec.CSI.VolumeHandle {
				return &b.Images[i]
			}
		}
	}
	return nil
}

// podRun runs the e2e image's program in a running pod (`kubectl exec`),
// e.g. `verify /data/file`, and returns what it printed.
func (c *cluster) podRun(t *testing.T, ns, pod string, args ...string) string {
	t.Helper()
	return strings.TrimSpace(c.Exec(t, ns, pod, "e2e", append([]string{podBinary}, args...)...))
}

// spindle runs the operators' kubectl plugin (built by `make build`) with
// the cluster's kubeconfig, as user (--as) unless it is empty. Without
// SPINDLE_E2E_NODE_ADDRESS it finds the node plugins and the controller
// itself, through the API server. It returns stdout and the exit status,
// failing the test on status 2 (the command could not run).
func (c *cluster) spindle(t *testing.T, user string, args ...string) (string, int) {
	t.Helper()
	bin, err := filepath.Abs("../../bin/kubectl-spindle")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kubectl-spindle is not built (make build): %v", err)
	}
	args = append(args, "--kubeconfig", c.Kubeconfig)
	args = append(args, c.NodeAddressFlags()...)
	if user != "" {
		args = append(args, "--as", user)
	}
	cmd := exec.Command(bin, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	code := 0
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("kubectl-spindle %v: %v", args, err)
	}
	if code != 0 && code != 1 {
		t.Fatalf("kubectl-spindle %v: exit %d\n%s%s", args, code, stdout.String(), stderr.String())
	}
	return stdout.String(), code
}
