package kube

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
)

// Exec runs command in a pod's container through the API server, as
// `kubectl exec` does, and returns its stdout; the test fails when the
// command cannot start or exits non-zero, with what it wrote to stderr.
func (c *Cluster) Exec(t testing.TB, ns, pod, container string, command ...string) string {
	t.Helper()
	stdout, err := c.TryExec(context.Background(), ns, pod, container, command...)
	if err != nil {
		t.Fatal(err)
	}
	return stdout
}

// TryExec is Exec returning the error instead of failing the test.
func (c *Cluster) TryExec(ctx context.Context, ns, pod, container string, command ...string) (string, error) {
	req := c.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: command, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	exec, err := remotecommand.NewWebSocketExecutor(c.Config, "GET", req.URL().String())
	if err != nil {
		return "", fmt.Errorf("exec in pod %s/%s: %w", ns, pod, err)
	}
	var stdout, stderr bytes.Buffer
	if err := exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		return stdout.String(), fmt.Errorf("exec %q in pod %s/%s: %w: %s", strings.Join(command, " "), ns, pod, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
