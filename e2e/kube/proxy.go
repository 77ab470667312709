package kube

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/spindle-csi/spindle/internal/opsapi"
)

// The chart's pods and the ports of their operators' endpoints (values.yaml:
// driver.metrics.nodePort, controllerPort).
const (
	ChartNodePlugins  = "app.kubernetes.io/name=spindle,app.kubernetes.io/component=node"
	ChartControllers  = "app.kubernetes.io/name=spindle,app.kubernetes.io/component=controller"
	nodeMetricsPort   = 9808
	controllerMetrics = 9810
)

// PodLog returns a container's log, through the API server (kubelet).
func (c *Cluster) PodLog(t testing.TB, ns, name string) string {
	t.Helper()
	data, err := c.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("log of pod %s/%s: %v", ns, name, err)
	}
	return string(data)
}

// WaitLogLine waits until the pod's log has a line starting with prefix
// and returns that line.
func (c *Cluster) WaitLogLine(t testing.TB, ns, name, prefix string) string {
	t.Helper()
	var line string
	c.WaitFor(t, "a line "+strconv.Quote(prefix+"...")+" in the log of pod "+name, func(ctx context.Context) (bool, error) {
		data, err := c.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, err
		}
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, prefix) {
				line = l
				return true, nil
			}
		}
		return false, nil
	})
	return line
}

// chartPod is the chart's pod matching selector (on node, if not empty).
func (c *Cluster) chartPod(t testing.TB, selector, node string) *corev1.Pod {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatalf("list pods %s: %v", selector, err)
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; (node == "" || p.Spec.NodeName == node) && p.Status.Phase == corev1.PodRunning {
			return p
		}
	}
	t.Fatalf("no running pod %s on node %q (the chart's deployment)", selector, node)
	return nil
}

// proxyGet GETs path from a pod's port through the API server's pod proxy,
// as kubectl-spindle does, and decodes the JSON answer into v.
func (c *Cluster) proxyGet(t testing.TB, pod *corev1.Pod, port int, path string, v any) {
	t.Helper()
	data, err := c.Client.CoreV1().RESTClient().Get().Namespace(pod.Namespace).Resource("pods").
		Name(pod.Name + ":" + strconv.Itoa(port)).SubResource("proxy").Suffix(path).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("GET %s of pod %s/%s through the API server: %v", path, pod.Namespace, pod.Name, err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s of pod %s/%s: %v\n%s", path, pod.Namespace, pod.Name, err, data)
	}
}

// NodeVolumes is what the node plugin on node has staged and attached (its
// /volumes), read through the API server: the node as the cluster sees it,
// not this machine's mount table.
func (c *Cluster) NodeVolumes(t testing.TB, node string) opsapi.NodeVolumes {
	t.Helper()
	var v opsapi.NodeVolumes
	c.proxyGet(t, c.chartPod(t, ChartNodePlugins, node), nodeMetricsPort, "/volumes", &v)
	return v
}

// ControllerImages is the controller's view of every backend's images and
// the nodes each is published to (its /images), through the API server.
func (c *Cluster) ControllerImages(t testing.TB) opsapi.Images {
	t.Helper()
	var v opsapi.Images
	c.proxyGet(t, c.chartPod(t, ChartControllers, ""), controllerMetrics, "/images", &v)
	return v
}
