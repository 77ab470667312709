package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/template"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// krewPlugin mirrors krew's index.Plugin (sigs.k8s.io/krew/pkg/index),
// the fields a manifest may have; decoding is strict.
type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string `json:"version"`
		ShortDescription string `json:"shortDescription"`
		Description      string `json:"description"`
		Caveats          string `json:"caveats"`
		Homepage         string `json:"homepage"`
		Platforms        []struct {
			Selector *metav1.LabelSelector `json:"selector"`
			URI      string                `json:"uri"`
			Sha256   string                `json:"sha256"`
			Bin      string                `json:"bin"`
			Files    []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
		} `json:"platforms"`
	} `json:"spec"`
}

// renderKrewManifest renders hack/krew/spindle.yaml as krew-release-bot
// does for tag: addURIAndSha writes the archive's uri and a sha256 (here
// of the URI, as no archive is downloaded).
func renderKrewManifest(t *testing.T, tag string) []byte {
	t.Helper()
	raw, err := os.ReadFile("../../hack/krew/spindle.yaml")
	if err != nil {
		t.Fatal(err)
	}
	addURIAndSha := func(uriTemplate, tag string) (string, error) {
		var uri bytes.Buffer
		tmpl, err := template.New("uri").Parse(uriTemplate)
		if err != nil {
			return "", err
		}
		if err := tmpl.Execute(&uri, struct{ TagName string }{tag}); err != nil {
			return "", err
		}
		sum := sha256.Sum256(uri.Bytes())
		return fmt.Sprintf("uri: %s\n    sha256: %s", uri.String(), hex.EncodeToString(sum[:])), nil
	}
	tmpl, err := template.New("krew").Funcs(template.FuncMap{"addURIAndSha": addURIAndSha}).Parse(string(raw))
	if err != nil {
		t.Fatalf("hack/krew/spindle.yaml: %v", err)
	}
	var out bytes.Buffer
	if err := tmpl.Execute(&out, struct{ TagName string }{tag}); err != nil {
		t.Fatalf("hack/krew/spindle.yaml: %v", err)
	}
	return out.Bytes()
}

// The krew manifest, rendered for a release, passes the checks of krew's
// validation.ValidatePlugin and offers a binary for each platform the
// plugin builds for.
func TestKrewManifest(t *testing.T) {
	const tag = "v0.2.0"
	var p krewPlugin
	rendered := renderKrewManifest(t, tag)
	if err := yaml.UnmarshalStrict(rendered, &p); err != nil {
		t.Fatalf("rendered manifest: %v\n%s", err, rendered)
	}
	if p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || p.Kind != "Plugin" {
		t.Errorf("apiVersion %q kind %q", p.APIVersion, p.Kind)
	}
	// kubectl runs kubectl-spindle for `kubectl spindle`.
	if p.Metadata.Name != "spindle" || p.Spec.Version != tag || p.Spec.ShortDescription == "" {
		t.Errorf("name %q version %q shortDescription %q", p.Metadata.Name, p.Spec.Version, p.Spec.ShortDescription)
	}
	sha := regexp.MustCompile(`^[a-f0-9]{64}$`)
	var platforms []string
	for _, pl := range p.Spec.Platforms {
		if pl.Selector == nil || len(pl.Selector.MatchLabels) != 2 || len(pl.Selector.MatchExpressions) != 0 {
			t.Errorf("platform selector %+v: want matchLabels os and arch", pl.Selector)
			continue
		}
		osName, arch := pl.Selector.MatchLabels["os"], pl.Selector.MatchLabels["arch"]
		platforms = append(platforms, osName+"/"+arch)
		bin := "kubectl-spindle"
		if osName == "windows" {
			bin += ".exe"
		}
		wantURI := fmt.Sprintf("https://github.com/spindle-csi/spindle/releases/download/%s/kubectl-spindle_%s_%s_%s.tar.gz", tag, tag, osName, arch)
		if pl.URI != wantURI || !sha.MatchString(pl.Sha256) {
			t.Errorf("%s/%s: uri %q sha256 %q, want %s and a sha256", osName, arch, pl.URI, pl.Sha256, wantURI)
		}
		var from []string
		for _, f := range pl.Files {
			from = append(from, f.From)
		}
		if pl.Bin != bin || !slices.Contains(from, bin) || !slices.Contains(from, "LICENSE") {
			t.Errorf("%s/%s: bin %q files %v, want %s and LICENSE", osName, arch, pl.Bin, from, bin)
		}
	}
	want := []string{"linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64", "windows/amd64"}
	if !slices.Equal(platforms, want) {
		t.Errorf("platforms %v, want %v", platforms, want)
	}
	if !strings.Contains(p.Spec.Caveats, "pods/proxy") {
		t.Errorf("caveats do not name the RBAC the plugin needs: %q", p.Spec.Caveats)
	}
}
