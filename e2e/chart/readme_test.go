//go:build root

package chart

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// Every key of values.yaml is documented in the chart's README, as
// `key`, or as `a.b.c` / `.d` for keys sharing a prefix.
func TestReadmeDocumentsEveryValue(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	leafKeys("", values, &keys)
	if len(keys) < 40 {
		t.Fatalf("only %d keys found in values.yaml: %v", len(keys), keys)
	}
	for _, k := range keys {
		if strings.Contains(string(readme), "`"+k+"`") {
			continue
		}
		// `sidecars.x.image.repository` / `.tag` on one line
		if i := strings.LastIndex(k, "."); i > 0 && slices.ContainsFunc(strings.Split(string(readme), "\n"), func(l string) bool {
			return strings.Contains(l, "`"+k[:i]+".") && strings.Contains(l, "` / `"+k[i:]+"`")
		}) {
			continue
		}
		t.Errorf("values key %s is not in charts/spindle/README.md", k)
	}
}
