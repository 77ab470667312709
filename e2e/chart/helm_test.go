//go:build root

// Package chart tests the Helm chart charts/spindle: `helm lint`, and
// `helm template` with the default values, every example values file and a
// few variants, parsed into the Kubernetes API types and checked for what
// makes the driver work in a cluster (privileged node pod, mount
// propagation, socket paths, sidecar flags, RBAC, ServiceAccounts) and for
// what the schema must refuse. With a running local cluster
// (hack/local-cluster) it also has kube-apiserver dry-run every object.
//
// helm is built by hack/helm.sh (`make test` and `make chart-test` run it);
// without it the tests skip, saying so. SPINDLE_HELM names another binary.
package chart

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir    = "../../charts/spindle"
	release     = "spindle"
	namespace   = "kube-system"
	kubeVersion = "1.36.0"
	helmVersion = "v3.21.4" // hack/helm.sh's pin
)

// helm returns the helm binary (hack/helm.sh builds it), or fails the test.
func helm(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("SPINDLE_HELM"); h != "" {
		return h
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	h := filepath.Join(cache, "spindle", "tools", "helm-"+helmVersion, "helm")
	if _, err := os.Stat(h); err != nil {
		t.Fatalf("helm is not built (%s): run hack/helm.sh, or `make chart-test`, which builds it", h)
	}
	return h
}

func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helm(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// exampleFiles are the chart's example values files.
func exampleFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "examples", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no example values files in %s/examples: %v", chartDir, err)
	}
	return files
}

// object is one rendered manifest.
type object struct {
	Kind, Name string
	raw        []byte // JSON
}

// rendering is the output of one `helm template`.
type rendering struct {
	objects []object
}

// template renders the chart with values files and --set flags.
func template(t *testing.T, valuesFiles []string, sets ...string) (*rendering, error) {
	t.Helper()
	args := []string{"template", release, chartDir, "--namespace", namespace, "--kube-version", kubeVersion}
	for _, f := range valuesFiles {
		args = append(args, "-f", f)
	}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out, err := runHelm(t, args...)
	if err != nil {
		return nil, err
	}
	r := &rendering{}
	for _, doc := range strings.Split(out, "\n---") {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		js, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("rendered YAML does not parse: %v\n%s", err, doc)
		}
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(js, &meta); err != nil {
			t.Fatal(err)
		}
		r.objects = append(r.objects, object{Kind: meta.Kind, Name: meta.Metadata.Name, raw: js})
	}
	return r, nil
}

func mustTemplate(t *testing.T, valuesFiles []string, sets ...string) *rendering {
	t.Helper()
	r, err := template(t, valuesFiles, sets...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// all decodes, strictly (an unknown field is a template bug), every object
// of a kind.
func all[T any](t *testing.T, r *rendering, kind string) []T {
	t.Helper()
	var out []T
	for _, o := range r.objects {
		if o.Kind != kind {
			continue
		}
		var v T
		if err := yaml.UnmarshalStrict(o.raw, &v); err != nil {
			t.Fatalf("%s %s does not decode into the API type: %v", o.Kind, o.Name, err)
		}
		out = append(out, v)
	}
	return out
}

// one decodes the object kind/name, failing when it is not there.
func one[T any](t *testing.T, r *rendering, kind, name string) T {
	t.Helper()
	for _, o := range r.objects {
		if o.Kind == kind && o.Name == name {
			var v T
			if err := yaml.UnmarshalStrict(o.raw, &v); err != nil {
				t.Fatalf("%s %s does not decode into the API type: %v", kind, name, err)
			}
			return v
		}
	}
	t.Fatalf("no %s %s rendered; have %v", kind, name, r.names())
	var zero T
	return zero
}

func (r *rendering) has(kind, name string) bool {
	for _, o := range r.objects {
		if o.Kind == kind && o.Name == name {
			return true
		}
	}
	return false
}

func (r *rendering) names() []string {
	var n []string
	for _, o := range r.objects {
		n = append(n, o.Kind+"/"+o.Name)
	}
	sort.Strings(n)
	return n
}

// decodeAll decodes every object into its API type; it fails on a kind
// the chart should not render.
func decodeAll(t *testing.T, r *rendering) {
	t.Helper()
	for _, o := range r.objects {
		var v any
		switch o.Kind {
		case "Deployment":
			v = &appsv1.Deployment{}
		case "DaemonSet":
			v = &appsv1.DaemonSet{}
		case "ServiceAccount":
			v = &corev1.ServiceAccount{}
		case "ConfigMap":
			v = &corev1.ConfigMap{}
		case "ClusterRole":
			v = &rbacv1.ClusterRole{}
		case "ClusterRoleBinding":
			v = &rbacv1.ClusterRoleBinding{}
		case "Role":
			v = &rbacv1.Role{}
		case "RoleBinding":
			v = &rbacv1.RoleBinding{}
		case "CSIDriver":
			v = &storagev1.CSIDriver{}
		case "StorageClass":
			v = &storagev1.StorageClass{}
		case "PodDisruptionBudget":
			v = &policyv1.PodDisruptionBudget{}
		case "VolumeSnapshotClass":
			v = &volumeSnapshotClass{}
		case "Service":
			v = &corev1.Service{}
		case "ServiceMonitor":
			v = &serviceMonitor{}
		default:
			t.Errorf("unexpected kind %s (%s) rendered", o.Kind, o.Name)
			continue
		}
		if err := yaml.UnmarshalStrict(o.raw, v); err != nil {
			t.Errorf("%s %s does not decode into the API type: %v", o.Kind, o.Name, err)
		}
	}
}

// volumeSnapshotClass mirrors snapshot.storage.k8s.io/v1 VolumeSnapshotClass
// (the snapshotter's client module is not a dependency of this module).
type volumeSnapshotClass struct {
	APIVersion     string            `json:"apiVersion"`
	Kind           string            `json:"kind"`
	Metadata       metaOnly          `json:"metadata"`
	Driver         string            `json:"driver"`
	DeletionPolicy string            `json:"deletionPolicy"`
	Parameters     map[string]string `json:"parameters,omitempty"`
}

type metaOnly struct {
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// leafKeys lists the dotted paths of values.yaml's keys down to the first
// list or empty map (what the README documents).
func leafKeys(prefix string, v any, out *[]string) {
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 {
		*out = append(*out, prefix)
		return
	}
	for k, sub := range m {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		leafKeys(p, sub, out)
	}
}
