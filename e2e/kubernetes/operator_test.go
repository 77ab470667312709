//go:build cluster

package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/e2e/kube"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// chartNodePlugins are the chart's labels of the node plugin pods, which
// kubectl-spindle finds by default.
const chartNodePlugins = kube.ChartNodePlugins

// 9. What an operator sees with the chart's deployment and nothing else:
// no --node-address, no node annotation. kubectl-spindle reaches the node
// plugin and the controller through the API server's pod proxy: `volumes`,
// `describe` (the device, staging path and mount state from the node) and
// `doctor` give the whole chain. A user whose RBAC lacks pods/proxy gets a
// finding that names the missing permission.
func TestOperatorViewThroughAPIServerProxy(t *testing.T) {
	c := connect(t)
	driverNS := c.chartNamespace(t)
	ns := c.Namespace(t)
	_, pv := c.Claim(t, ns, "viewed", kube.ClaimOptions{})
	c.Pod(t, ns, "user", "viewed", kube.PodOptions{Args: []string{"pause"}})
	user := c.WaitPod(t, ns, "user", corev1.PodRunning)
	c.Attachment(t, pv.Name, c.Node, "attached", func(a *storagev1.VolumeAttachment) bool { return a.Status.Attached })

	c.checkVolumesThroughProxy(t, pv)
	staged, _ := c.stagedOnce(t, pv, user)
	describe, _ := c.spindle(t, "", "describe", "viewed", "-n", ns)
	t.Logf("$ kubectl spindle describe viewed -n %s\n%s", ns, describe)
	for _, want := range []string{
		"Volume:     " + pv.Spec.CSI.VolumeHandle,
		"device:       " + staged.Device,
		"staging path: " + staged.StagingPath,
		"mount:        mounted, ext4, read-only=false",
		fmt.Sprintf("Pod:        %s/user on %s (Running)", ns, c.Node),
	} {
		if !strings.Contains(describe, want) {
			t.Errorf("describe does not show %q", want)
		}
	}
	if strings.Contains(describe, "node plugin:") {
		t.Errorf("describe could not ask the node plugin")
	}
	c.checkDoctorThroughProxy(t)

	// The same commands for a user who may read everything they read,
	// but not pods/proxy.
	viewer := c.viewerWithoutPodsProxy(t)
	want := fmt.Sprintf(`cannot get pods/proxy in namespace %s: RBAC needs verb "get" on resource "pods/proxy" for user %q`, driverNS, viewer)
	doctor, code := c.spindle(t, viewer, "doctor")
	t.Logf("$ kubectl spindle doctor --as %s\n%s", viewer, doctor)
	for _, w := range []string{
		"[NodePluginUnreachable] node/" + c.Node + ": ", "[ControllerUnreachable] controller: ", want,
		fmt.Sprintf("fix: kubectl create role spindle-operator-pods-proxy -n %s --verb=get --resource=pods/proxy", driverNS),
	} {
		if !strings.Contains(doctor, w) {
			t.Errorf("doctor as %s does not say %q", viewer, w)
		}
	}
	if code != 1 {
		t.Errorf("doctor as %s exited %d, want 1 (findings)", viewer, code)
	}
	describe, _ = c.spindle(t, viewer, "describe", "viewed", "-n", ns)
	if !strings.Contains(describe, "  node plugin: ") || !strings.Contains(describe, want) {
		t.Errorf("describe as %s does not say %q:\n%s", viewer, want, describe)
	}
}

// chartNamespace is the namespace of the chart's node plugin on the test
// node; the test skips when the driver is not deployed by the chart.
func (c *cluster) chartNamespace(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: chartNodePlugins})
	if err != nil {
		t.Fatalf("list the chart's node plugin pods: %v", err)
	}
	if len(pods.Items) == 0 {
		t.Skipf("the driver is not deployed by the chart (no pod labelled %s): this test runs against DEPLOY=helm", chartNodePlugins)
	}
	if flags := c.NodeAddressFlags(); len(flags) > 0 {
		t.Skipf("the driver's endpoints are given directly (%v): this test finds them through the API server", flags)
	}
	node, err := c.Client.CoreV1().Nodes().Get(ctx, c.Node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if addr, ok := node.Annotations["spindle.csi.dev/metrics-address"]; ok {
		t.Fatalf("node %s has the annotation spindle.csi.dev/metrics-address=%s; the test is about finding the plugin without it", c.Node, addr)
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName == c.Node {
			return p.Namespace
		}
	}
	t.Fatalf("no node plugin pod on %s among %d labelled %s", c.Node, len(pods.Items), chartNodePlugins)
	return ""
}

// checkVolumesThroughProxy: `volumes -o json` shows the volume attached
// to the test node.
func (c *cluster) checkVolumesThroughProxy(t *testing.T, pv *corev1.PersistentVolume) {
	t.Helper()
	out, _ := c.spindle(t, "", "volumes", "-o", "json")
	var rows []struct {
		PV          string `json:"pv"`
		Attachments []struct{ Node, State string }
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("kubectl spindle volumes -o json: %v\n%s", err, out)
	}
	for _, r := range rows {
		if r.PV == pv.Name && len(r.Attachments) == 1 && r.Attachments[0].Node == c.Node && r.Attachments[0].State == "attached" {
			table, _ := c.spindle(t, "", "volumes")
			t.Logf("$ kubectl spindle volumes\n%s", table)
			return
		}
	}
	t.Errorf("kubectl spindle volumes does not show %s attached to %s:\n%s", pv.Name, c.Node, out)
}

// checkDoctorThroughProxy: doctor reads the node plugin and the controller
// (nothing unreachable) and finds nothing wrong with the test's volume.
func (c *cluster) checkDoctorThroughProxy(t *testing.T) {
	t.Helper()
	table, _ := c.spindle(t, "", "doctor")
	t.Logf("$ kubectl spindle doctor\n%s", table)
	out, _ := c.spindle(t, "", "doctor", "-o", "json")
	var findings []struct{ Kind, Object, Node, Message string }
	if err := json.Unmarshal([]byte(out), &findings); err != nil {
		t.Fatalf("kubectl spindle doctor -o json: %v\n%s", err, out)
	}
	for _, f := range findings {
		switch {
		case f.Kind == "ControllerUnreachable", f.Kind == "NodePluginUnreachable" && f.Node == c.Node:
			t.Errorf("doctor could not read through the API server: [%s] %s: %s", f.Kind, f.Object, f.Message)
		case f.Node == c.Node:
			t.Errorf("doctor finds a problem on %s: [%s] %s: %s", c.Node, f.Kind, f.Object, f.Message)
		}
	}
}

// viewerWithoutPodsProxy creates a user who may get and list what
// kubectl-spindle reads, but not pods/proxy, and waits until RBAC says so.
func (c *cluster) viewerWithoutPodsProxy(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	name := "spindle-e2e-viewer"
	read := []string{"get", "list"}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"persistentvolumes", "persistentvolumeclaims", "nodes", "pods", "events"}, Verbs: read},
		{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"volumeattachments", "csinodes"}, Verbs: read},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}}}
	if _, err := c.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ClusterRole %s: %v", name, err)
	}
	t.Cleanup(func() { _ = c.Client.RbacV1().ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{}) })
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ClusterRoleBinding %s: %v", name, err)
	}
	t.Cleanup(func() { _ = c.Client.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{}) })
	c.WaitFor(t, "RBAC to let "+name+" list pods", func(ctx context.Context) (bool, error) {
		review, err := c.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: name,
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Resource: "pods"}},
		}, metav1.CreateOptions{})
		return err == nil && review.Status.Allowed, err
	})
	return name
}
