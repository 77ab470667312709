package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/spindle-csi/spindle/internal/opsapi"
)

// NodeAddressAnnotation on a Node names its node plugin's metrics address
// (host:port), for clusters where the plugin is not on the node's
// InternalIP and the default port.
const NodeAddressAnnotation = "spindle.csi.dev/metrics-address"

// NodePlugins fetches a node plugin's /volumes document.
type NodePlugins interface {
	NodeVolumes(ctx context.Context, node *corev1.Node) (*opsapi.NodeVolumes, error)
}

// Controller fetches the controller's /images document.
type Controller interface {
	Images(ctx context.Context) (*opsapi.Images, error)
}

// httpNodePlugins finds a node plugin at, in order: an --node-address
// override for the node, the node's NodeAddressAnnotation, the node's
// InternalIP on --node-port (the chart's node plugin runs with
// hostNetwork and --metrics-address=:<port>).
type httpNodePlugins struct {
	client    *http.Client
	overrides map[string]string // node name -> host:port or URL
	port      int
}

// nodeURL is where node's plugin serves its endpoints.
func (h *httpNodePlugins) nodeURL(node *corev1.Node) (string, error) {
	if addr, ok := h.overrides[node.Name]; ok {
		return baseURL(addr), nil
	}
	if addr := node.Annotations[NodeAddressAnnotation]; addr != "" {
		return baseURL(addr), nil
	}
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return "http://" + net.JoinHostPort(a.Address, strconv.Itoa(h.port)), nil
		}
	}
	return "", fmt.Errorf("node %s has no InternalIP; give its plugin's address with --node-address=%s=HOST:PORT", node.Name, node.Name)
}

func baseURL(addr string) string {
	if strings.Contains(addr, "://") {
		return strings.TrimSuffix(addr, "/")
	}
	return "http://" + addr
}

func (h *httpNodePlugins) NodeVolumes(ctx context.Context, node *corev1.Node) (*opsapi.NodeVolumes, error) {
	base, err := h.nodeURL(node)
	if err != nil {
		return nil, err
	}
	var nv opsapi.NodeVolumes
	if err := getJSON(ctx, h.client, base+opsapi.PathVolumes, &nv); err != nil {
		return nil, fmt.Errorf("node plugin of %s: %w", node.Name, err)
	}
	return &nv, nil
}

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
