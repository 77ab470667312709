package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/spindle-csi/spindle/internal/opsapi"
)

func TestNodeURL(t *testing.T) {
	h := &httpNodePlugins{overrides: map[string]string{"node-o": "127.0.0.1:19808"}, port: 9808}
	annotated := readyNode("node-a", true)
	annotated.Annotations = map[string]string{NodeAddressAnnotation: "192.168.1.5:7000"}
	noIP := readyNode("node-x", true)
	noIP.Status.Addresses = nil
	tests := []struct {
		node *corev1.Node
		want string
	}{
		{readyNode("node-o", true), "http://127.0.0.1:19808"},
		{annotated, "http://192.168.1.5:7000"},
		{readyNode("node-1", true), "http://10.0.0.1:9808"},
	}
	for _, tt := range tests {
		if got, err := h.nodeURL(tt.node); err != nil || got != tt.want {
			t.Errorf("nodeURL(%s) = %q, %v; want %q", tt.node.Name, got, err, tt.want)
		}
	}
	if _, err := h.nodeURL(noIP); err == nil || !strings.Contains(err.Error(), "--node-address=node-x=") {
		t.Errorf("nodeURL of a node without an InternalIP: %v; want advice on --node-address", err)
	}
}

func TestHTTPNodePlugins(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != opsapi.PathVolumes {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(healthyNode())
	}))
	t.Cleanup(srv.Close)
	h := &httpNodePlugins{client: srv.Client(), overrides: map[string]string{"node-1": srv.URL}}
	nv, err := h.NodeVolumes(context.Background(), readyNode("node-1", true))
	if err != nil || len(nv.Staged) != 1 || nv.Staged[0].Device != "/dev/loop3" {
		t.Fatalf("NodeVolumes = %+v, %v", nv, err)
	}
	c := &httpController{client: srv.Client(), url: srv.URL}
	if _, err := c.Images(context.Background()); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("Images from a server without /images: %v, want the 404", err)
	}
}
