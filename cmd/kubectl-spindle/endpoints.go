package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/spindle-csi/spindle/internal/opsapi"
)

// NodeAddressAnnotation on a Node names its node plugin's metrics address
// (host:port), for a plugin that does not run in the chart's pods (which
// the plugin finds through the API server by itself).
const NodeAddressAnnotation = "spindle.csi.dev/metrics-address"

// NodePlugins fetches a node plugin's /volumes document.
type NodePlugins interface {
	NodeVolumes(ctx context.Context, node *corev1.Node) (*opsapi.NodeVolumes, error)
}

// Controller fetches the controller's /images document.
type Controller interface {
	Images(ctx context.Context) (*opsapi.Images, error)
}

// nodePlugins finds a node's plugin at, in order: an --node-address
// override for the node, the node's NodeAddressAnnotation (both read
// directly over HTTP, for plugins outside the chart), else through the API
// server's proxy to the node's plugin pod (the chart's deployment, whatever
// its network: no node IP, no hostNetwork, no open port needed).
type nodePlugins struct {
	client    *http.Client
	overrides map[string]string // node name -> host:port or URL
	proxy     NodePlugins       // nil: only direct addresses
}

// directURL is where an override or annotation says node's plugin serves
// its endpoints; "" when neither does.
func (h *nodePlugins) directURL(node *corev1.Node) string {
	if addr, ok := h.overrides[node.Name]; ok {
		return baseURL(addr)
	}
	if addr := node.Annotations[NodeAddressAnnotation]; addr != "" {
		return baseURL(addr)
	}
	return ""
}

func baseURL(addr string) string {
	if strings.Contains(addr, "://") {
		return strings.TrimSuffix(addr, "/")
	}
	return "http://" + addr
}

func (h *nodePlugins) NodeVolumes(ctx context.Context, node *corev1.Node) (*opsapi.NodeVolumes, error) {
	base := h.directURL(node)
	if base == "" {
		if h.proxy == nil {
			return nil, fmt.Errorf("node %s: no --node-address for it and no way through the API server", node.Name)
		}
		return h.proxy.NodeVolumes(ctx, node)
	}
	var nv opsapi.NodeVolumes
	if err := getJSON(ctx, h.client, base+opsapi.PathVolumes, &nv); err != nil {
		return nil, fmt.Errorf("node plugin of %s: %w", node.Name, err)
	}
	return &nv, nil
}

// httpController reads /images from --controller-url directly.
type httpController struct {
	client *http.Client
	url    string
}

func (h *httpController) Images(ctx context.Context) (*opsapi.Images, error) {
	var imgs opsapi.Images
	if err := getJSON(ctx, h.client, baseURL(h.url)+opsapi.PathImages, &imgs); err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	return &imgs, nil
}

func getJSON(ctx context.Context, client *http.Client, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}
