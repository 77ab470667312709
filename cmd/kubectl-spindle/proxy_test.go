package main

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/spindle-csi/spindle/internal/opsapi"
)

const nodeAProxyPath = "/api/v1/namespaces/kube-system/pods/spindle-node-a:9808/proxy/volumes"

// The node plugin of a node is its chart pod, reached at
// /api/v1/namespaces/NS/pods/NAME:PORT/proxy/volumes; what keeps it from
// being reached is said, RBAC's refusals with the missing rule.
func TestProxyNodePlugins(t *testing.T) {
	onNode1 := func(name string, change func(*corev1.Pod)) *corev1.Pod {
		return driverPod(name, componentNode, "node-1", change)
	}
	args := func(a ...string) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Spec.Containers[0].Args, p.Spec.Containers[0].Ports = a, nil }
	}
	tests := []struct {
		name      string
		pods      []runtime.Object
		proxied   map[string]any
		refused   []string
		user      string // impersonated; "" the admin
		namespace string // --driver-namespace
		wantPath  string // the proxied request, when it succeeds
		wantErr   []string
	}{
		{name: "the pod's declared metrics port", pods: objects(onNode1("spindle-node-a", nil)),
			proxied: map[string]any{nodeAProxyPath: healthyNode()}, wantPath: nodeAProxyPath},
		{name: "the port of --metrics-address", pods: objects(onNode1("spindle-node-a", args("--metrics-address=:9100"))),
			proxied:  map[string]any{"/api/v1/namespaces/kube-system/pods/spindle-node-a:9100/proxy/volumes": healthyNode()},
			wantPath: "/api/v1/namespaces/kube-system/pods/spindle-node-a:9100/proxy/volumes"},
		{name: "--node-port for a pod that says nothing", pods: objects(onNode1("spindle-node-a", args())),
			proxied:  map[string]any{"/api/v1/namespaces/kube-system/pods/spindle-node-a:9999/proxy/volumes": healthyNode()},
			wantPath: "/api/v1/namespaces/kube-system/pods/spindle-node-a:9999/proxy/volumes"},
		{name: "the node's own pod", pods: objects(
			driverPod("spindle-node-b", componentNode, "node-2", nil), onNode1("spindle-node-a", nil)),
			proxied: map[string]any{nodeAProxyPath: healthyNode()}, wantPath: nodeAProxyPath},
		{name: "in --driver-namespace", namespace: "kube-system", pods: objects(onNode1("spindle-node-a", nil)),
			proxied: map[string]any{nodeAProxyPath: healthyNode()}, wantPath: nodeAProxyPath},
		{name: "metrics disabled", pods: objects(onNode1("spindle-node-a", args("--mode=node"))),
			wantErr: []string{"pod kube-system/spindle-node-a serves no endpoints", "driver.metrics.enabled"}},
		{name: "bound to loopback", pods: objects(onNode1("spindle-node-a", args("--metrics-address=127.0.0.1:9808"))),
			wantErr: []string{"listens on 127.0.0.1:9808 only", "10.244.0.9", "driver.metrics.bindAddress"}},
		{name: "not running", pods: objects(onNode1("spindle-node-a", func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending })),
			wantErr: []string{"no running node plugin pod of spindle.csi.dev on node node-1", "kube-system/spindle-node-a is Pending", "--node-address=node-1=HOST:PORT"}},
		{name: "another driver's pod", pods: objects(onNode1("spindle-node-a", args("--driver-name=other.csi.dev", "--metrics-address=:9808"))),
			wantErr: []string{"no running node plugin pod of spindle.csi.dev on node node-1 (labels app.kubernetes.io/name=spindle,app.kubernetes.io/component=node, in any namespace)"}},
		{name: "not in --driver-namespace", namespace: "storage", pods: objects(onNode1("spindle-node-a", nil)),
			wantErr: []string{"on node node-1 (labels app.kubernetes.io/name=spindle,app.kubernetes.io/component=node, in namespace storage)"}},
		{name: "unreachable pod", pods: objects(onNode1("spindle-node-a", nil)),
			wantErr: []string{"node plugin of node-1 (pod kube-system/spindle-node-a, through the API server)", "connection refused"}},
		{name: "the plugin fails", pods: objects(onNode1("spindle-node-a", nil)), proxied: map[string]any{nodeAProxyPath: "inventory failed"},
			wantErr: []string{"pod kube-system/spindle-node-a", "inventory failed"}},
		{name: "pods/proxy refused", pods: objects(onNode1("spindle-node-a", nil)), proxied: map[string]any{nodeAProxyPath: healthyNode()},
			user: "alice", refused: []string{"alice get pods/proxy"},
			wantErr: []string{`cannot get pods/proxy in namespace kube-system: RBAC needs verb "get" on resource "pods/proxy" for user "alice" ` +
				`(the API server said: pods "spindle-node-a:9808" is forbidden: User "alice" cannot get resource "pods/proxy" in API group "" in the namespace "kube-system")`}},
		{name: "listing pods refused", pods: objects(onNode1("spindle-node-a", nil)),
			user: "alice", refused: []string{"alice list pods"},
			wantErr: []string{`cannot list pods in any namespace: RBAC needs verb "list" on resource "pods" for user "alice"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := &fakeAPIServer{objects: tt.pods, proxied: tt.proxied, refused: map[string]bool{}}
			for _, r := range tt.refused {
				api.refused[r] = true
			}
			_, kube := newFakeAPIServer(t, api, tt.user)
			p := &proxyNodePlugins{
				pods:  &podFinder{kube: kube, namespace: tt.namespace, selector: DefaultPodSelector, driver: testDriver},
				proxy: &podProxy{kube: kube, timeout: 10 * time.Second}, port: 9999,
			}
			nv, err := p.NodeVolumes(context.Background(), readyNode("node-1", true))
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("NodeVolumes = %+v; want an error with %q", nv, tt.wantErr)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q\nlacks %q", err, w)
					}
				}
				return
			}
			if err != nil || len(nv.Staged) != 1 || nv.Staged[0].Device != "/dev/loop3" {
				t.Fatalf("NodeVolumes = %+v, %v; want node-1's volumes", nv, err)
			}
			if !slices.Contains(api.requested(), "admin GET "+tt.wantPath) {
				t.Errorf("requests %v; want GET %s", api.requested(), tt.wantPath)
			}
		})
	}
}

// A refusal is a PermissionError whose fix grants exactly the missing
// rule, to the user or service account the API server named.
func TestPermissionError(t *testing.T) {
	tests := []struct {
		err  *PermissionError
		text string
		fix  string
	}{
		{&PermissionError{Verb: "get", Resource: "pods/proxy", Namespace: "kube-system", User: "alice", Err: errors.New("denied")},
			`cannot get pods/proxy in namespace kube-system: RBAC needs verb "get" on resource "pods/proxy" for user "alice" (the API server said: denied)`,
			"kubectl create role spindle-operator-pods-proxy -n kube-system --verb=get --resource=pods/proxy && " +
				"kubectl create rolebinding spindle-operator-pods-proxy -n kube-system --role=spindle-operator-pods-proxy --user=alice"},
		{&PermissionError{Verb: "list", Resource: "pods", User: "system:serviceaccount:ops:viewer", Err: errors.New("denied")},
			`cannot list pods in any namespace: RBAC needs verb "list" on resource "pods" for user "system:serviceaccount:ops:viewer" (the API server said: denied)`,
			"kubectl create clusterrole spindle-operator-pods --verb=list --resource=pods && " +
				"kubectl create clusterrolebinding spindle-operator-pods --clusterrole=spindle-operator-pods --serviceaccount=ops:viewer"},
		{&PermissionError{Verb: "get", Resource: "pods/proxy", Namespace: "storage", Err: errors.New("denied")},
			`cannot get pods/proxy in namespace storage: RBAC needs verb "get" on resource "pods/proxy" (the API server said: denied)`,
			"kubectl create role spindle-operator-pods-proxy -n storage --verb=get --resource=pods/proxy && " +
				"kubectl create rolebinding spindle-operator-pods-proxy -n storage --role=spindle-operator-pods-proxy --user=<you>"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.text {
			t.Errorf("Error() = %s\nwant      %s", got, tt.text)
		}
		if got := tt.err.Fix(); got != tt.fix {
			t.Errorf("Fix() = %s\nwant    %s", got, tt.fix)
		}
	}
}

func TestProxyController(t *testing.T) {
	ctrlPath := "/api/v1/namespaces/kube-system/pods/spindle-controller-0:9810/proxy/images"
	ctrl := driverPod("spindle-controller-0", componentCtrl, "node-2", func(p *corev1.Pod) {
		p.Spec.Containers[0].Ports[0].ContainerPort = 9810
	})
	tests := []struct {
		name    string
		pods    []runtime.Object
		wantErr string
	}{
		{name: "the controller's pod", pods: objects(ctrl, driverPod("spindle-node-a", componentNode, "node-1", nil))},
		{name: "no controller", pods: objects(driverPod("spindle-node-a", componentNode, "node-1", nil)),
			wantErr: "controller: no running controller pod of spindle.csi.dev (labels app.kubernetes.io/name=spindle,app.kubernetes.io/component=controller, in any namespace)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := &fakeAPIServer{objects: tt.pods, proxied: map[string]any{ctrlPath: healthyImages()}}
			_, kube := newFakeAPIServer(t, api, "")
			c := &proxyController{pods: &podFinder{kube: kube, selector: DefaultPodSelector, driver: testDriver},
				proxy: &podProxy{kube: kube, timeout: 10 * time.Second}, port: 9999}
			imgs, err := c.Images(context.Background())
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("Images = %+v, %v; want %s", imgs, err, tt.wantErr)
				}
				return
			}
			if err != nil || len(imgs.Backends) != 1 || imgs.Backends[0].Images[0].VolumeID != handleA {
				t.Fatalf("Images = %+v, %v", imgs, err)
			}
		})
	}
}

// The pods are listed once however many nodes are asked.
func TestPodFinderListsOnce(t *testing.T) {
	api := &fakeAPIServer{objects: objects(driverPod("spindle-node-a", componentNode, "node-1", nil)),
		proxied: map[string]any{nodeAProxyPath: &opsapi.NodeVolumes{}}}
	_, kube := newFakeAPIServer(t, api, "")
	p := &proxyNodePlugins{pods: &podFinder{kube: kube, selector: DefaultPodSelector, driver: testDriver},
		proxy: &podProxy{kube: kube, timeout: 10 * time.Second}}
	for _, n := range []string{"node-1", "node-2", "node-1"} {
		_, _ = p.NodeVolumes(context.Background(), readyNode(n, true))
	}
	lists := 0
	for _, r := range api.requested() {
		if strings.HasSuffix(r, "GET /api/v1/pods") {
			lists++
		}
	}
	if lists != 1 {
		t.Errorf("pods listed %d times: %v", lists, api.requested())
	}
}
