//go:build root

package chart

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// serviceMonitor mirrors the fields of monitoring.coreos.com/v1
// ServiceMonitor that the chart sets (the Prometheus Operator's module is
// not a dependency of this module); decoding is strict, so a field the
// chart sets and this type lacks fails the test.
type serviceMonitor struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Scheme        string `json:"scheme"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// workloads are the controller's and the node plugin's pod templates.
func workloads(t *testing.T, r *rendering) map[string]corev1.PodTemplateSpec {
	return map[string]corev1.PodTemplateSpec{
		"controller": one[appsv1.Deployment](t, r, "Deployment", "spindle-controller").Spec.Template,
		"node":       one[appsv1.DaemonSet](t, r, "DaemonSet", "spindle-node").Spec.Template,
	}
}

// metricsPort is the driver container's port named "metrics", or nil.
func metricsPort(c *corev1.Container) *corev1.ContainerPort {
	for i := range c.Ports {
		if c.Ports[i].Name == "metrics" {
			return &c.Ports[i]
		}
	}
	return nil
}

// checkMetrics: each driver container declares the port it serves its
// endpoints on as "metrics", on an address the API server's pod proxy
// reaches (kubectl-spindle), and a headless Service per component selects
// exactly that component's pods by that port.
func checkMetrics(t *testing.T, r *rendering) {
	for component, tmpl := range workloads(t, r) {
		d := container(t, tmpl.Spec, "spindle")
		addr, _ := flag(d.Args, "metrics-address")
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Errorf("%s: --metrics-address=%q: %v", component, addr, err)
			continue
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
			t.Errorf("%s: --metrics-address=%s is out of the API server's pod proxy's reach", component, addr)
		}
		p := metricsPort(d)
		if p == nil || strconv.Itoa(int(p.ContainerPort)) != port || p.Protocol != corev1.ProtocolTCP {
			t.Errorf("%s: driver container ports %+v, want metrics on TCP %s (--metrics-address=%s)", component, d.Ports, port, addr)
			continue
		}
		svc := one[corev1.Service](t, r, "Service", "spindle-"+component+"-metrics")
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("Service %s clusterIP %q, want headless", svc.Name, svc.Spec.ClusterIP)
		}
		for other, otherTmpl := range workloads(t, r) {
			if selects := labelsMatch(svc.Spec.Selector, otherTmpl.Labels); selects != (other == component) {
				t.Errorf("Service %s selector %v selects the %s pods (%v): %v", svc.Name, svc.Spec.Selector, other, otherTmpl.Labels, selects)
			}
		}
		if component == "controller" && tmpl.Spec.HostNetwork {
			// Declared ports are host ports there: a surge pod would never
			// be scheduled next to the old one.
			s := one[appsv1.Deployment](t, r, "Deployment", "spindle-controller").Spec.Strategy
			if s.RollingUpdate == nil || s.RollingUpdate.MaxSurge == nil || s.RollingUpdate.MaxSurge.IntValue() != 0 {
				t.Errorf("controller in the host network with a surge: strategy %+v", s)
			}
		}
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort != intstr.FromString("metrics") || svc.Spec.Ports[0].Port != p.ContainerPort {
			t.Errorf("Service %s ports %+v, want port %d to the pods' port metrics", svc.Name, svc.Spec.Ports, p.ContainerPort)
		}
	}
}

// With the default values, what the issue asks of the chart: the ports
// declared, a metrics Service per component, the controller's
// PodDisruptionBudget, the priority classes, and no ServiceMonitor.
func TestDefaultsForOperators(t *testing.T) {
	helm(t)
	r := mustTemplate(t, nil)
	wantPorts := map[string]int32{"controller": 9810, "node": 9838}
	wantHostNetwork := map[string]bool{"controller": false, "node": true}
	wantPriority := map[string]string{"controller": "system-cluster-critical", "node": "system-node-critical"}
	for component, tmpl := range workloads(t, r) {
		if p := metricsPort(container(t, tmpl.Spec, "spindle")); p == nil || p.ContainerPort != wantPorts[component] {
			t.Errorf("%s: metrics port %+v, want %d", component, p, wantPorts[component])
		}
		if tmpl.Spec.HostNetwork != wantHostNetwork[component] {
			t.Errorf("%s: hostNetwork %v by default, want %v", component, tmpl.Spec.HostNetwork, wantHostNetwork[component])
		}
		if tmpl.Spec.PriorityClassName != wantPriority[component] {
			t.Errorf("%s: priorityClassName %q, want %s", component, tmpl.Spec.PriorityClassName, wantPriority[component])
		}
		if lp := container(t, tmpl.Spec, "liveness-probe"); lp == nil || len(lp.Ports) != 1 || lp.Ports[0].Name != "healthz" {
			t.Errorf("%s: livenessprobe without its healthz port", component)
		}
	}
	// On the host network every port of the node pods is the node's: each
	// distinct, none the controller's (a controller in the host network on
	// the same node), none livenessprobe's default 9808, which other CSI
	// drivers' node plugins take there. Registration takes no port (a unix
	// socket below kubelet's plugins_registry).
	seen := map[int32]string{}
	for component, tmpl := range workloads(t, r) {
		for _, c := range tmpl.Spec.Containers {
			for _, p := range c.Ports {
				if other, dup := seen[p.ContainerPort]; dup {
					t.Errorf("port %d of %s/%s is also %s's", p.ContainerPort, component, c.Name, other)
				}
				seen[p.ContainerPort] = component + "/" + c.Name
				if p.ContainerPort == 9808 {
					t.Errorf("%s/%s declares 9808, livenessprobe's default", component, c.Name)
				}
			}
		}
	}
	for _, name := range []string{"spindle-controller-metrics", "spindle-node-metrics"} {
		if !r.has("Service", name) {
			t.Errorf("no Service %s; have %v", name, r.names())
		}
	}
	pdb := one[policyv1.PodDisruptionBudget](t, r, "PodDisruptionBudget", "spindle-controller")
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable %v, want 1", pdb.Spec.MaxUnavailable)
	}
	if n := len(all[serviceMonitor](t, r, "ServiceMonitor")); n != 0 {
		t.Errorf("%d ServiceMonitors rendered by default", n)
	}
}

// The ServiceMonitor is there only when enabled, and scrapes both metrics
// Services; without metrics there are neither ports nor Services.
func TestServiceMonitor(t *testing.T) {
	helm(t)
	tests := []struct {
		name     string
		sets     []string
		monitor  bool
		services bool
		interval string
		wantErr  string
	}{
		{name: "defaults", services: true},
		{name: "enabled", sets: []string{"driver.metrics.serviceMonitor.enabled=true"}, monitor: true, services: true},
		{name: "with an interval and labels", sets: []string{"driver.metrics.serviceMonitor.enabled=true",
			"driver.metrics.serviceMonitor.interval=30s", "driver.metrics.serviceMonitor.labels.release=prometheus"},
			monitor: true, services: true, interval: "30s"},
		{name: "no Services", sets: []string{"driver.metrics.service.enabled=false"}},
		{name: "no metrics", sets: []string{"driver.metrics.enabled=false"}},
		{name: "a monitor without Services", sets: []string{"driver.metrics.serviceMonitor.enabled=true", "driver.metrics.service.enabled=false"},
			wantErr: "driver.metrics.serviceMonitor.enabled needs driver.metrics.enabled and driver.metrics.service.enabled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := template(t, nil, tt.sets...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("helm template: %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			decodeAll(t, r)
			services := all[corev1.Service](t, r, "Service")
			if (len(services) == 2) != tt.services || !tt.services && len(services) != 0 {
				t.Errorf("%d Services rendered, want them: %v", len(services), tt.services)
			}
			if slices.Contains(tt.sets, "driver.metrics.enabled=false") {
				for component, tmpl := range workloads(t, r) {
					if p := metricsPort(container(t, tmpl.Spec, "spindle")); p != nil {
						t.Errorf("%s declares port %+v although it serves nothing", component, p)
					}
				}
			}
			monitors := all[serviceMonitor](t, r, "ServiceMonitor")
			if (len(monitors) == 1) != tt.monitor || !tt.monitor && len(monitors) != 0 {
				t.Fatalf("%d ServiceMonitors rendered, want one: %v", len(monitors), tt.monitor)
			}
			if tt.monitor {
				checkServiceMonitor(t, monitors[0], services, tt.interval)
				if slices.Contains(tt.sets, "driver.metrics.serviceMonitor.labels.release=prometheus") && monitors[0].Metadata.Labels["release"] != "prometheus" {
					t.Errorf("ServiceMonitor labels %v lack release=prometheus", monitors[0].Metadata.Labels)
				}
			}
		})
	}
}

// checkServiceMonitor: the monitor selects every metrics Service, in the
// release's namespace, by the port name they share.
func checkServiceMonitor(t *testing.T, m serviceMonitor, services []corev1.Service, interval string) {
	t.Helper()
	if m.APIVersion != "monitoring.coreos.com/v1" {
		t.Errorf("ServiceMonitor apiVersion %q", m.APIVersion)
	}
	sel, err := metav1.LabelSelectorAsSelector(&m.Spec.Selector)
	if err != nil {
		t.Fatalf("ServiceMonitor selector: %v", err)
	}
	for _, svc := range services {
		if !sel.Matches(labels.Set(svc.Labels)) {
			t.Errorf("ServiceMonitor selector %s does not select Service %s (%v)", sel, svc.Name, svc.Labels)
		}
	}
	if !slices.Equal(m.Spec.NamespaceSelector.MatchNames, []string{namespace}) {
		t.Errorf("ServiceMonitor namespaces %v, want [%s]", m.Spec.NamespaceSelector.MatchNames, namespace)
	}
	if len(m.Spec.Endpoints) != 1 || m.Spec.Endpoints[0].Port != "metrics" || m.Spec.Endpoints[0].Path != "/metrics" || m.Spec.Endpoints[0].Interval != interval {
		t.Errorf("ServiceMonitor endpoints %+v, want port metrics, /metrics, interval %q", m.Spec.Endpoints, interval)
	}
}
