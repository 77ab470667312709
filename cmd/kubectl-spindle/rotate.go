package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/spindle-csi/spindle/internal/opsapi"
)

// Key rotation of an encrypted volume while it is in use. The controller
// alone writes the volume's record and only the node that stages it can
// rekey its LUKS header, so the plugin makes three requests (see
// internal/driver/rotation.go): the controller makes and records the next
// key, the node adds it to the header and removes the current one, the
// controller makes it the volume's. The KMS's secrets come from the
// Secret the PV names for NodeStageVolume, read with the user's own
// credentials: rotating a key takes the right to read that Secret.

// KeyRotator posts to the driver's endpoints.
type KeyRotator interface {
	PostController(ctx context.Context, path string, in, out any) error
	PostNode(ctx context.Context, node *corev1.Node, path string, in, out any) error
}

// RotatedVolume is what rotate-key reports.
type RotatedVolume struct {
	PV          string `json:"pv"`
	VolumeID    string `json:"volumeID"`
	KMSID       string `json:"kmsID"`
	Node        string `json:"node"`
	StagingPath string `json:"stagingPath"`
	// SecretRef is the Secret whose values went with the requests
	// (namespace/name), "" when the PV names none.
	SecretRef string `json:"secretRef,omitempty"`
}

// RotateKey rotates the key of the volume what names (as describe takes it).
func RotateKey(ctx context.Context, client kubernetes.Interface, driver, namespace, what string, r KeyRotator) (*RotatedVolume, error) {
	inv, err := readInventory(ctx, client, driver)
	if err != nil {
		return nil, err
	}
	pv, _, err := resolve(ctx, client, inv, namespace, what)
	if err != nil {
		return nil, err
	}
	handle := pv.Spec.CSI.VolumeHandle
	var nodeName string
	for _, a := range inv.volumeOf(pv).Attachments {
		if a.State == "attached" {
			nodeName = a.Node
			break
		}
	}
	if nodeName == "" {
		return nil, fmt.Errorf("volume %s (PV %s) is attached to no node: its key is rotated by the node that stages it; run a pod that uses it", handle, pv.Name)
	}
	node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return nil, asPermissionError(err, "get", "nodes", "")
	}
	out := &RotatedVolume{PV: pv.Name, VolumeID: handle}
	var secrets map[string]string
	if ref := pv.Spec.CSI.NodeStageSecretRef; ref != nil {
		s, err := client.CoreV1().Secrets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("the Secret the PV names for NodeStageVolume: %w", asPermissionError(err, "get", "secrets", ref.Namespace))
		}
		secrets = map[string]string{}
		for k, v := range s.Data {
			secrets[k] = string(v)
		}
		for k, v := range s.StringData {
			secrets[k] = v
		}
		out.SecretRef = ref.Namespace + "/" + ref.Name
	}
	var plan opsapi.KeyRotation
	if err := r.PostController(ctx, opsapi.PathRotateKey, opsapi.RotateKeyRequest{VolumeID: handle, Secrets: secrets}, &plan); err != nil {
		return nil, fmt.Errorf("controller: start the rotation: %w", err)
	}
	plan.Secrets = secrets
	var done opsapi.RotatedKey
	if err := r.PostNode(ctx, node, opsapi.PathRekey, plan, &done); err != nil {
		return nil, fmt.Errorf("node plugin of %s: rekey the volume: %w (the rotation is recorded; run rotate-key again to finish it)", nodeName, err)
	}
	if err := r.PostController(ctx, opsapi.PathCommitKey, opsapi.CommitKeyRequest{VolumeID: handle, NextWrappedKey: plan.NextWrappedKey}, nil); err != nil {
		return nil, fmt.Errorf("controller: record the new key: %w (the volume opens with either key; run rotate-key again to finish it)", err)
	}
	out.KMSID, out.Node, out.StagingPath = plan.KMSID, done.Node, done.StagingPath
	return out, nil
}

func printRotated(w io.Writer, r *RotatedVolume) {
	fmt.Fprintf(w, "rotated the key of %s (PV %s, KMS %s) on node %s, staged at %s\n", r.VolumeID, r.PV, r.KMSID, r.Node, r.StagingPath)
}

// rotator posts directly (--controller-url, --node-address and the Node
// annotation) or through the API server's pod proxy.
type rotator struct {
	client     *http.Client
	nodes      *nodePlugins
	controller string // --controller-url
	pods       *podFinder
	proxy      *podProxy
	nodePort   int
	ctrlPort   int
}

func (r *rotator) PostController(ctx context.Context, path string, in, out any) error {
	if r.controller != "" {
		return postJSON(ctx, r.client, baseURL(r.controller)+path, rotationTimeout, in, out)
	}
	pod, err := r.pods.find(ctx, componentCtrl, "")
	if err != nil {
		return err
	}
	port, err := endpointPort(pod, r.ctrlPort)
	if err != nil {
		return err
	}
	return r.proxy.postJSON(ctx, pod, port, path, rotationTimeout, in, out)
}

func (r *rotator) PostNode(ctx context.Context, node *corev1.Node, path string, in, out any) error {
	if base := r.nodes.directURL(node); base != "" {
		return postJSON(ctx, r.client, base+path, rotationTimeout, in, out)
	}
	pod, err := r.pods.find(ctx, componentNode, node.Name)
	if err != nil {
		return err
	}
	port, err := endpointPort(pod, r.nodePort)
	if err != nil {
		return err
	}
	return r.proxy.postJSON(ctx, pod, port, path, rotationTimeout, in, out)
}

// rotationTimeout bounds one request of a rotation; the driver gives each
// step two minutes.
const rotationTimeout = 3 * time.Minute
