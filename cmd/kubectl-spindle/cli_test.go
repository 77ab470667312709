package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// kubectl's own flags, the subcommands and shell completion are there.
func TestRunHelpAndCompletion(t *testing.T) {
	fakeClients := func(options) (*clients, error) {
		return &clients{kube: fake.NewClientset(healthyCluster()...), namespace: "apps", now: now}, nil
	}
	tests := []struct {
		args []string
		want []string // in stdout
	}{
		{[]string{"--help"}, []string{"kubectl spindle", "volumes", "describe", "doctor", "rotate-key", "adopt", "completion",
			"--kubeconfig", "--context", "--as", "--token", "--server", "--request-timeout", "-n, --namespace", "-o, --output"}},
		{[]string{"volumes", "--help"}, []string{"-A, --all-namespaces"}},
		{[]string{"doctor", "--help"}, []string{"--node-address", "--controller-url", "--driver-namespace", "--stuck-after", "exits 1 when it found problems"}},
		{[]string{"rotate-key", "--help"}, []string{"rotate-key PVC|pvc/NAME|pv/NAME|VOLUME-ID", "free LUKS keyslot"}},
		{[]string{"adopt", "--help"}, []string{"adopt pvc/NAME", "--dry-run", "--storage-class", "--secret"}},
		{[]string{"completion", "bash"}, []string{"bash completion", "kubectl-spindle"}},
		{[]string{"completion", "zsh"}, []string{"#compdef kubectl-spindle"}},
		{[]string{"__complete", "describe", ""}, []string{"data-a\n", "pv/pvc-a\n", ":4\n"}},
		{[]string{"__complete", "describe", "pv/"}, []string{"pv/pvc-a\n"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), tt.args, &stdout, &stderr, fakeClients); code != exitOK {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, stdout.String())
				}
			}
		})
	}
}

// The real clients, built from kubectl's flags (--server, --as), reach
// the node plugin and the controller through the API server; for a user
// whom RBAC refuses pods/proxy, doctor names the missing permission and
// the command that grants it.
func TestRunDoctorThroughTheAPIServer(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctrlPath := "/api/v1/namespaces/kube-system/pods/spindle-controller-0:9810/proxy/images"
	cluster := func() []runtime.Object {
		return append(healthyCluster(), driverPod("spindle-node-a", componentNode, "node-1", nil),
			driverPod("spindle-controller-0", componentCtrl, "node-1", func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort = 9810 }))
	}
	tests := []struct {
		name     string
		as       []string
		wantCode int
		want     []string
	}{
		{name: "admin", wantCode: exitOK, want: []string{"No problems found."}},
		{name: "without pods/proxy", as: []string{"--as", "alice"}, wantCode: exitFindings, want: []string{
			`[NodePluginUnreachable] node/node-1: node plugin of node-1 (pod kube-system/spindle-node-a, through the API server): ` +
				`cannot get pods/proxy in namespace kube-system: RBAC needs verb "get" on resource "pods/proxy" for user "alice"`,
			"fix: kubectl create role spindle-operator-pods-proxy -n kube-system --verb=get --resource=pods/proxy && " +
				"kubectl create rolebinding spindle-operator-pods-proxy -n kube-system --role=spindle-operator-pods-proxy --user=alice",
			`[ControllerUnreachable] controller: controller (pod kube-system/spindle-controller-0, through the API server): cannot get pods/proxy in namespace kube-system`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := &fakeAPIServer{objects: cluster(), refused: map[string]bool{"alice get pods/proxy": true},
				proxied: map[string]any{nodeAProxyPath: healthyNode(), ctrlPath: healthyImages()}}
			srv, _ := newFakeAPIServer(t, api, "")
			args := append([]string{"doctor", "--kubeconfig", kubeconfig, "--server", srv.URL, "--request-timeout", "30s"}, tt.as...)
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), args, &stdout, &stderr, nil)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.wantCode, stdout.String(), stderr.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("doctor's output lacks %q:\n%s", w, stdout.String())
				}
			}
			user := "admin"
			if len(tt.as) > 0 {
				user = tt.as[1]
			}
			for _, path := range []string{nodeAProxyPath, ctrlPath} {
				if !slices.Contains(api.requested(), user+" GET "+path) {
					t.Errorf("no GET %s as %s: %v", path, user, api.requested())
				}
			}
		})
	}
}

// run with -o json prints the same volumes as the table, as JSON.
func TestRunVolumesJSON(t *testing.T) {
	client := fake.NewClientset(volumesCluster()...)
	for _, tt := range []struct {
		args []string
		want []string // PVs
	}{
		{[]string{"volumes", "-o", "json", "-n", "apps"}, []string{"pvc-a"}},
		{[]string{"volumes", "-o", "json", "-n", "apps", "-A"}, []string{"pvc-a", "pvc-b", "pvc-c", "pvc-d"}},
		{[]string{"vol", "-o", "json"}, []string{"pvc-a", "pvc-b", "pvc-c", "pvc-d"}},
		// Every command takes every flag, as scripts give them.
		{[]string{"volumes", "-o", "json", "-n", "db", "--node-address", "node-1=127.0.0.1:9808", "--stuck-after", "0s"}, []string{"pvc-b", "pvc-c"}},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tt.args, &stdout, &stderr, func(options) (*clients, error) {
				return &clients{kube: client, namespace: "default", now: now}, nil
			})
			if code != exitOK {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			var vols []Volume
			if err := json.Unmarshal(stdout.Bytes(), &vols); err != nil {
				t.Fatalf("%v\n%s", err, stdout.String())
			}
			var pvs []string
			for _, v := range vols {
				pvs = append(pvs, v.PV)
			}
			if !slices.Equal(pvs, tt.want) {
				t.Errorf("PVs %v, want %v", pvs, tt.want)
			}
			if vols[0].PV == "pvc-a" && (len(vols[0].Attachments) != 2 || vols[0].Attachments[0].Metadata["imagePath"] != "/pool/pvc-a.img") {
				t.Errorf("pvc-a = %+v", vols[0])
			}
		})
	}
}

func TestRunRejectsBadUsage(t *testing.T) {
	tests := []struct {
		args []string
		want string // in stderr
	}{
		{[]string{"volumes", "-o", "wide"}, `-o "wide": must be table, json or yaml`},
		{[]string{"nonsense"}, `unknown command "nonsense"`},
		{[]string{"describe"}, "describe takes one PVC, PV or volume ID"},
		{[]string{"volumes", "extra"}, "volumes takes no arguments"},
		{[]string{"doctor", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"describe", "x", "--node-address", "node-1"}, `--node-address="node-1": want NODE=HOST:PORT`},
		{[]string{"describe", "-A", "x"}, "unknown shorthand flag: 'A' in -A"},
		{[]string{}, "no command given"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tt.args, &stdout, &stderr, func(o options) (*clients, error) {
				if _, err := parseNodeAddresses(o.nodeAddresses); err != nil {
					return nil, err
				}
				return &clients{kube: fake.NewClientset(), now: now}, nil
			})
			if code != exitError || !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("exit %d with stderr %q; want %d and %q", code, stderr.String(), exitError, tt.want)
			}
		})
	}
}
