//go:build root

package chart

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// The schema refuses what the chart would otherwise ignore or render wrong.
func TestSchemaRejects(t *testing.T) {
	helm(t)
	valuesFile := func(t *testing.T, yaml string) []string {
		f := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(f, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		return []string{f}
	}
	for _, c := range []struct {
		name string
		sets []string
		yaml string
		want string // in helm's error
	}{
		{name: "unknown top-level key", sets: []string{"replicas=2"}, want: "'replicas' not allowed"},
		{name: "unknown controller key", sets: []string{"controller.replica=2"}, want: "'replica' not allowed"},
		{name: "unknown sidecar key", sets: []string{"sidecars.attacher.enabled=false"}, want: "'enabled' not allowed"},
		{name: "unknown image key", sets: []string{"driver.image.digest=sha256:00"}, want: "'digest' not allowed"},
		{name: "unknown storage class key", sets: []string{"storageClasses[0].name=a", "storageClasses[0].provisioner=x"}, want: "'provisioner' not allowed"},
		{name: "unknown loop key", yaml: "config:\n  backends:\n    - {type: loop, name: a, loop: {pooldir: /p}}\n", want: "'pooldir' not allowed"},
		{name: "unknown backend type", yaml: "config:\n  backends:\n    - {type: nfs, name: a}\n", want: "/config/backends/0/type"},
		{name: "section of another type", yaml: "config:\n  backends:\n    - {type: loop, name: a, loop: {poolDir: /p}, rbd: {clusterID: c, pool: p}}\n", want: "/config/backends/0"},
		{name: "relative pool", yaml: "config:\n  backends:\n    - {type: loop, name: a, loop: {poolDir: p}}\n", want: "/config/backends/0/loop/poolDir"},
		{name: "no backends", yaml: "config:\n  backends: []\n", want: "/config/backends"},
		{name: "relative kubelet dir", sets: []string{"kubeletDir=var/lib/kubelet"}, want: "/kubeletDir"},
		{name: "registration", sets: []string{"node.registration=both"}, want: "/node/registration"},
		{name: "node mode", sets: []string{"node.mode=controller"}, want: "/node/mode"},
		{name: "pull policy", sets: []string{"imagePullPolicy=never"}, want: "/imagePullPolicy"},
		{name: "log level", sets: []string{"driver.logLevel=trace"}, want: "/driver/logLevel"},
		{name: "inlined cephx key", sets: []string{"storageClasses[0].name=a", "storageClasses[0].parameters.userKey=AQBx"}, want: "invalid propertyName 'userKey'"},
		{name: "inlined CHAP password", yaml: "storageClasses:\n  - name: a\n    parameters: {node.session.auth.password: s3cret}\n", want: "invalid propertyName"},
		{name: "unknown metrics Service key", sets: []string{"driver.metrics.service.port=9000"}, want: "'port' not allowed"},
		{name: "unknown ServiceMonitor key", sets: []string{"driver.metrics.serviceMonitor.namespace=monitoring"}, want: "'namespace' not allowed"},
		{name: "ServiceMonitor interval", sets: []string{"driver.metrics.serviceMonitor.interval=30"}, want: "/driver/metrics/serviceMonitor/interval"},
		{name: "unknown KMS type", sets: []string{"kms.a.encryptionKMSType=kmip"}, want: "/kms/a/encryptionKMSType"},
		{name: "inlined Vault token", sets: []string{"kms.a.encryptionKMSType=vaulttransit", "kms.a.vaultToken=hvs.x"}, want: "'vaultToken' not allowed"},
		{name: "inlined snapshot secret", yaml: "volumeSnapshotClasses:\n  - name: a\n    parameters: {token: x}\n", want: "invalid propertyName 'token'"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var files []string
			if c.yaml != "" {
				files = valuesFile(t, c.yaml)
			}
			_, err := template(t, files, c.sets...)
			if err == nil {
				t.Fatalf("helm template accepted %v %q", c.sets, c.yaml)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error does not mention %q:\n%v", c.want, err)
			}
		})
	}
}

// Each optional container can be turned off, and takes its RBAC with it.
func TestOptionalContainers(t *testing.T) {
	helm(t)
	for _, c := range []struct {
		name            string
		sets            []string
		controllerGone  []string
		nodeGone        []string
		clusterRoleGone []string
	}{
		{name: "resizer", sets: []string{"sidecars.resizer.enabled=false"}, controllerGone: []string{"csi-resizer"}, clusterRoleGone: []string{"spindle-resizer"}},
		{name: "snapshotter", sets: []string{"sidecars.snapshotter.enabled=false"}, controllerGone: []string{"csi-snapshotter"}, clusterRoleGone: []string{"spindle-snapshotter"}},
		{name: "livenessprobe", sets: []string{"sidecars.livenessProbe.enabled=false"}, controllerGone: []string{"liveness-probe"}, nodeGone: []string{"liveness-probe"}},
		{name: "registrar", sets: []string{"node.registration=driver"}, nodeGone: []string{"node-driver-registrar"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before, after := mustTemplate(t, nil), mustTemplate(t, nil, c.sets...)
			for _, r := range []struct {
				r       *rendering
				present bool
			}{{before, true}, {after, false}} {
				ctrl := containerNames(one[appsv1.Deployment](t, r.r, "Deployment", "spindle-controller").Spec.Template.Spec)
				node := containerNames(one[appsv1.DaemonSet](t, r.r, "DaemonSet", "spindle-node").Spec.Template.Spec)
				for _, n := range c.controllerGone {
					if slices.Contains(ctrl, n) != r.present {
						t.Errorf("controller containers %v: %s present should be %v", ctrl, n, r.present)
					}
				}
				for _, n := range c.nodeGone {
					if slices.Contains(node, n) != r.present {
						t.Errorf("node containers %v: %s present should be %v", node, n, r.present)
					}
				}
				for _, n := range c.clusterRoleGone {
					if r.r.has("ClusterRole", n) != r.present || r.r.has("ClusterRoleBinding", n) != r.present {
						t.Errorf("ClusterRole(Binding) %s present should be %v", n, r.present)
					}
				}
			}
		})
	}
}

// A templated secret name (${pvc.name}) cannot be named in resourceNames:
// the rule then covers every Secret, for that sidecar only.
func TestTemplatedSecretName(t *testing.T) {
	helm(t)
	r := mustTemplate(t, nil, "storageClasses[0].name=a",
		"storageClasses[0].parameters.csi\\.storage\\.k8s\\.io/provisioner-secret-name=${pvc.name}",
		"storageClasses[0].parameters.csi\\.storage\\.k8s\\.io/provisioner-secret-namespace=${pvc.namespace}")
	for _, name := range []string{"spindle-provisioner", "spindle-attacher"} {
		cr := one[rbacv1.ClusterRole](t, r, "ClusterRole", name)
		hasSecrets := slices.ContainsFunc(cr.Rules, func(rule rbacv1.PolicyRule) bool {
			return slices.Contains(rule.Resources, "secrets") && len(rule.ResourceNames) == 0
		})
		if hasSecrets != (name == "spindle-provisioner") {
			t.Errorf("%s may read every Secret: %v", name, hasSecrets)
		}
	}
}

// With a cluster up (SPINDLE_E2E_KUBECONFIG, or the local cluster's),
// kube-apiserver dry-runs every rendered object (server-side validation,
// admission, RBAC escalation checks).
func TestServerDryRun(t *testing.T) {
	helm(t)
	kubeconfig := os.Getenv("SPINDLE_E2E_KUBECONFIG")
	if kubeconfig == "" {
		dir := os.Getenv("SPINDLE_E2E_CLUSTER_DIR")
		if dir == "" {
			dir = "/var/tmp/spindle-local-cluster"
		}
		kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	}
	if _, err := os.Stat(kubeconfig); err != nil {
		t.Skipf("no cluster (%s): `hack/local-cluster/up.sh` brings one up, or set SPINDLE_E2E_KUBECONFIG", kubeconfig)
	}
	// The local cluster's kubectl, else the one on PATH.
	home, _ := os.UserHomeDir()
	kubectl := filepath.Join(home, ".cache", "spindle", "local-cluster", "bin", "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		if kubectl, err = exec.LookPath("kubectl"); err != nil {
			t.Skipf("no kubectl: run hack/local-cluster/build.sh or install one")
		}
	}
	probe := exec.Command(kubectl, "--kubeconfig", kubeconfig, "--request-timeout=5s", "get", "--raw", "/readyz")
	if out, err := probe.CombinedOutput(); err != nil {
		t.Skipf("the cluster's apiserver (%s) does not answer: %v %s", kubeconfig, err, out)
	}
	for _, c := range renderings() {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"template", release, chartDir, "--namespace", namespace, "--kube-version", kubeVersion}
			for _, f := range c.files {
				args = append(args, "-f", f)
			}
			for _, s := range c.sets {
				args = append(args, "--set", s)
			}
			manifest, err := runHelm(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			// On stdin: kubectl splits a -f path at commas, and the
			// subtests' temporary directories have them.
			cmd := exec.Command(kubectl, "--kubeconfig", kubeconfig, "--request-timeout=30s", "apply", "--dry-run=server", "-f", "-")
			cmd.Stdin = strings.NewReader(manifest)
			start := time.Now()
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("kubectl apply --dry-run=server: %v\n%s", err, out)
			}
			t.Logf("apiserver accepted %d objects in %v", strings.Count(string(out), "(server dry run)"), time.Since(start).Round(time.Millisecond))
		})
	}
}
