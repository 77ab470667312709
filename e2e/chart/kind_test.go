//go:build root

package chart

import (
	"bytes"
	"os"
	"slices"
	"testing"

	yaml "go.yaml.in/yaml/v3"
	kind "sigs.k8s.io/kind/pkg/apis/config/v1alpha4"
)

// hack/kind/config.yaml parses, strictly, into kind's own config types (as
// kind's loader does: go.yaml.in/yaml/v3 with known fields only), turns
// kind's own CNI off (hack/kind/network.sh makes the pod network) with
// kube-proxy in nftables mode, and gives every node /dev and the one shared
// pool at the chart's default pool path, without mount propagation (the
// host's mounts may be private).
func TestKindConfig(t *testing.T) {
	raw, err := os.ReadFile("../../hack/kind/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg kind.Cluster
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("hack/kind/config.yaml: %v", err)
	}
	if cfg.Kind != "Cluster" || cfg.APIVersion != "kind.x-k8s.io/v1alpha4" {
		t.Errorf("kind %q apiVersion %q", cfg.Kind, cfg.APIVersion)
	}
	kind.SetDefaultsCluster(&cfg)
	if !cfg.Networking.DisableDefaultCNI || cfg.Networking.KubeProxyMode != kind.NFTablesProxyMode {
		t.Errorf("networking %+v, want disableDefaultCNI and kube-proxy in nftables mode", cfg.Networking)
	}
	var roles []kind.NodeRole
	for _, n := range cfg.Nodes {
		roles = append(roles, n.Role)
	}
	if !slices.Equal(roles, []kind.NodeRole{kind.ControlPlaneRole, kind.WorkerRole, kind.WorkerRole}) {
		t.Errorf("node roles %v, want a control plane and two workers", roles)
	}
	pool := defaults.poolDirs[0] // the chart's default loop pool
	for i, n := range cfg.Nodes {
		var dev, sharedPool string
		for _, m := range n.ExtraMounts {
			switch m.ContainerPath {
			case "/dev":
				dev = m.HostPath
			case pool:
				sharedPool = m.HostPath
			}
			if m.Propagation != "" && m.Propagation != kind.MountPropagationNone {
				t.Errorf("node %d (%s) mounts %s with propagation %s, want None", i, n.Role, m.HostPath, m.Propagation)
			}
		}
		if dev != "/dev" {
			t.Errorf("node %d (%s) does not get the host's /dev", i, n.Role)
		}
		if sharedPool != "/var/tmp/spindle-kind/pool" {
			t.Errorf("node %d (%s) has pool %q from the host, want /var/tmp/spindle-kind/pool (what hack/kind-e2e.sh creates) at %s", i, n.Role, sharedPool, pool)
		}
	}
}
