package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/spindle-csi/spindle/internal/opsapi"
)

// An override or the node's annotation is read directly; any other node
// goes through the API server (proxy).
func TestNodePluginsDirectURL(t *testing.T) {
	h := &nodePlugins{overrides: map[string]string{"node-o": "127.0.0.1:19808", "node-u": "https://plugin.example:7000/"}}
	annotated := readyNode("node-a", true)
	annotated.Annotations = map[string]string{NodeAddressAnnotation: "192.168.1.5:7000"}
	tests := []struct {
		node *corev1.Node
		want string
	}{
		{readyNode("node-o", true), "http://127.0.0.1:19808"},
		{readyNode("node-u", true), "https://plugin.example:7000"},
		{annotated, "http://192.168.1.5:7000"},
		{readyNode("node-1", true), ""},
	}
	for _, tt := range tests {
		if got := h.directURL(tt.node); got != tt.want {
			t.Errorf("directURL(%s) = %q; want %q", tt.node.Name, got, tt.want)
		}
	}
}

// proxyCalls records the nodes nodePlugins handed to the proxy.
type proxyCalls struct{ nodes []string }

func (p *proxyCalls) NodeVolumes(_ context.Context, n *corev1.Node) (*opsapi.NodeVolumes, error) {
	p.nodes = append(p.nodes, n.Name)
	return nil, errors.New("through the proxy")
}

func TestNodePlugins(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != opsapi.PathVolumes {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(healthyNode())
	}))
	t.Cleanup(srv.Close)
	proxy := &proxyCalls{}
	h := &nodePlugins{client: srv.Client(), overrides: map[string]string{"node-1": srv.URL}, proxy: proxy}
	nv, err := h.NodeVolumes(context.Background(), readyNode("node-1", true))
	if err != nil || len(nv.Staged) != 1 || nv.Staged[0].Device != "/dev/loop3" {
		t.Fatalf("NodeVolumes = %+v, %v", nv, err)
	}
	if _, err := h.NodeVolumes(context.Background(), readyNode("node-2", true)); err == nil || strings.Join(proxy.nodes, ",") != "node-2" {
		t.Errorf("node-2 without an override: %v, proxy asked for %v; want the proxy's answer for node-2", err, proxy.nodes)
	}
	c := &httpController{client: srv.Client(), url: srv.URL}
	if _, err := c.Images(context.Background()); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("Images from a server without /images: %v, want the 404", err)
	}
}
