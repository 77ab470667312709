//go:build root

package chart

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// controllerSidecars are the controller's sidecars that talk to kube-apiserver.
var controllerSidecars = []string{"csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter"}

// lastFlag is the value of the last --name=value in args: the sidecars
// parse their flags in order, so a later one (a user's args) wins.
func lastFlag(args []string, name string) (string, bool) {
	for _, a := range slices.Backward(args) {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// The sidecars' kube-apiserver client limits and csi-attacher's workers:
// the chart's defaults above the sidecars' own (5 requests a second, a
// burst of 10, 10 attacher workers), which made 100 claims applied at once
// wait for their PVs and attachments (docs/benchmarks.md); the values set
// them, and a user's own args still win.
func TestSidecarClientLimits(t *testing.T) {
	helm(t)
	for _, c := range []struct {
		name                  string
		sets                  []string
		qps, burst, attachers string
	}{
		{name: "defaults", qps: "50", burst: "100", attachers: "100"},
		{name: "set", sets: []string{"controller.kubeAPIQPS=20", "controller.kubeAPIBurst=40", "sidecars.attacher.workerThreads=25"}, qps: "20", burst: "40", attachers: "25"},
		{name: "user args win", sets: []string{"sidecars.attacher.args={--kube-api-qps=7,--worker-threads=3}"}, qps: "50", burst: "100", attachers: "3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := one[appsv1.Deployment](t, mustTemplate(t, nil, c.sets...), "Deployment", "spindle-controller").Spec.Template.Spec
			for _, name := range controllerSidecars {
				s := container(t, spec, name)
				if s == nil {
					t.Fatalf("no %s in the controller: %v", name, containerNames(spec))
				}
				wantQPS := c.qps
				if name == "csi-attacher" && c.name == "user args win" {
					wantQPS = "7"
				}
				if got, _ := lastFlag(s.Args, "kube-api-qps"); got != wantQPS {
					t.Errorf("%s --kube-api-qps=%q, want %q (args %v)", name, got, wantQPS, s.Args)
				}
				if got, _ := lastFlag(s.Args, "kube-api-burst"); got != c.burst {
					t.Errorf("%s --kube-api-burst=%q, want %q", name, got, c.burst)
				}
			}
			if got, _ := lastFlag(container(t, spec, "csi-attacher").Args, "worker-threads"); got != c.attachers {
				t.Errorf("csi-attacher --worker-threads=%q, want %q", got, c.attachers)
			}
		})
	}
	for _, bad := range []string{"controller.kubeAPIQPS=0", "controller.kubeAPIBurst=0", "sidecars.attacher.workerThreads=0"} {
		if _, err := template(t, nil, bad); err == nil {
			t.Errorf("helm template accepted %s", bad)
		}
	}
}
