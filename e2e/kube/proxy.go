package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/spindle-csi/spindle/internal/opsapi"
)

// The chart's pods and the ports of their operators' endpoints (values.yaml:
// driver.metrics.nodePort, controllerPort).
const (
	ChartNodePlugins  = "app.kubernetes.io/name=spindle,app.kubernetes.io/component=node"
	ChartControllers  = "app.kubernetes.io/name=spindle,app.kubernetes.io/component=controller"
	nodeMetricsPort   = 9838
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

// ControllerLog is the log of the chart's controller's driver container
// since a time, through the API server.
func (c *Cluster) ControllerLog(t testing.TB, since time.Time) string {
	t.Helper()
	pod := c.chartPod(t, ChartControllers, "")
	from := metav1.NewTime(since)
	data, err := c.Client.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "spindle", SinceTime: &from}).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("log of the controller %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	return string(data)
}

// chartPod is the chart's pod matching selector (on node, if not empty).
func (c *Cluster) chartPod(t testing.TB, selector, node string) *corev1.Pod {
	t.Helper()
	pod, err := c.findChartPod(context.Background(), selector, node)
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

func (c *Cluster) findChartPod(ctx context.Context, selector, node string) (*corev1.Pod, error) {
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("list pods %s: %w", selector, err)
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; (node == "" || p.Spec.NodeName == node) && p.Status.Phase == corev1.PodRunning {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no running pod %s on node %q (the chart's deployment)", selector, node)
}

// proxyGet GETs path from a pod's port through the API server's pod proxy,
// as kubectl-spindle does, and decodes the JSON answer into v.
func (c *Cluster) proxyGet(ctx context.Context, pod *corev1.Pod, port int, path string, v any) error {
	data, err := c.proxyGetRaw(ctx, pod, port, path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s of pod %s/%s: %w\n%s", path, pod.Namespace, pod.Name, err, data)
	}
	return nil
}

// proxyGetRaw GETs path from a pod's port through the API server's pod proxy.
func (c *Cluster) proxyGetRaw(ctx context.Context, pod *corev1.Pod, port int, path string) ([]byte, error) {
	data, err := c.Client.CoreV1().RESTClient().Get().Namespace(pod.Namespace).Resource("pods").
		Name(pod.Name + ":" + strconv.Itoa(port)).SubResource("proxy").Suffix(path).DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("GET %s of pod %s/%s through the API server: %w", path, pod.Namespace, pod.Name, err)
	}
	return data, nil
}

// NodeVolumes is what the node plugin on node has staged and attached (its
// /volumes), read through the API server (or at EnvNodeAddress): the node as
// the cluster sees it, not this machine's mount table.
func (c *Cluster) NodeVolumes(t testing.TB, node string) opsapi.NodeVolumes {
	t.Helper()
	v, err := c.TryNodeVolumes(context.Background(), node)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TryNodeVolumes is NodeVolumes for a node plugin that may not answer yet
// (its node has just booted).
func (c *Cluster) TryNodeVolumes(ctx context.Context, node string) (opsapi.NodeVolumes, error) {
	var v opsapi.NodeVolumes
	if addr, ok := c.nodeAddresses[node]; ok {
		return v, directGet(ctx, "http://"+addr+opsapi.PathVolumes, &v)
	}
	pod, err := c.findChartPod(ctx, ChartNodePlugins, node)
	if err != nil {
		return v, err
	}
	return v, c.proxyGet(ctx, pod, metricsPort(pod, nodeMetricsPort), opsapi.PathVolumes, &v)
}

// metricsPort is the port the pod's driver container declares as
// "metrics", as kubectl-spindle finds it, else def: the node plugin's
// moved from 9808 (chart 0.1.0) to 9838 when it took the host's network.
func metricsPort(pod *corev1.Pod, def int) int {
	for _, ct := range pod.Spec.Containers {
		for _, p := range ct.Ports {
			if p.Name == "metrics" && ct.Name == "spindle" {
				return int(p.ContainerPort)
			}
		}
	}
	return def
}

// ControllerImages is the controller's view of every backend's images and
// the nodes each is published to (its /images), through the API server (or
// at EnvControllerURL).
func (c *Cluster) ControllerImages(t testing.TB) opsapi.Images {
	t.Helper()
	var v opsapi.Images
	var err error
	if c.controllerURL != "" {
		err = directGet(context.Background(), strings.TrimSuffix(c.controllerURL, "/")+opsapi.PathImages, &v)
	} else {
		pod := c.chartPod(t, ChartControllers, "")
		err = c.proxyGet(context.Background(), pod, metricsPort(pod, controllerMetrics), opsapi.PathImages, &v)
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// ControllerStartTime is when the controller's driver process started
// (process_start_time_seconds of its /metrics, in seconds since the epoch),
// through the API server (or at EnvControllerURL): a restart changes it.
func (c *Cluster) ControllerStartTime(t testing.TB) float64 {
	t.Helper()
	ctx := context.Background()
	var data []byte
	var err error
	if c.controllerURL != "" {
		data, err = directGetRaw(ctx, strings.TrimSuffix(c.controllerURL, "/")+opsapi.PathMetrics)
	} else {
		data, err = c.proxyGetRaw(ctx, c.chartPod(t, ChartControllers, ""), controllerMetrics, opsapi.PathMetrics)
	}
	if err != nil {
		t.Fatal(err)
	}
	const metric = "process_start_time_seconds "
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, metric); ok {
			start, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("the controller's %q: %v", line, err)
			}
			return start
		}
	}
	t.Fatalf("the controller's %s has no %s", opsapi.PathMetrics, strings.TrimSpace(metric))
	return 0
}

// directGet GETs a driver endpoint outside the cluster's pods and decodes
// the JSON answer into v.
func directGet(ctx context.Context, url string, v any) error {
	data, err := directGetRaw(ctx, url)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("GET %s: %w\n%s", url, err, data)
	}
	return nil
}

// directGetRaw GETs a driver endpoint outside the cluster's pods.
func directGetRaw(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, data)
	}
	return data, nil
}
