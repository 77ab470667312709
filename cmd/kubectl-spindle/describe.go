package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/spindle-csi/spindle/internal/opsapi"
)

// Description is the chain PVC -> PV -> VolumeAttachments -> nodes ->
// devices and staging paths -> pods, with the events of all of them.
type Description struct {
	PVC    *Claim     `json:"pvc,omitempty"`
	Volume Volume     `json:"volume"`
	Nodes  []NodeSide `json:"nodes"`
	Pods   []PodRef   `json:"pods"`
	Events []Event    `json:"events"`
	// Background is the controller's background work on the volume's
	// image (a flatten of a copy-on-write clone), when the controller
	// was asked; BackgroundError says why it could not be.
	Background      []opsapi.Task `json:"background,omitempty"`
	BackgroundError string        `json:"backgroundError,omitempty"`
	controllerAsked bool
}

// Claim is the PVC of a volume.
type Claim struct {
	Namespace    string `json:"namespace"`
	Name         string `json:"name"`
	Phase        string `json:"phase"`
	StorageClass string `json:"storageClass,omitempty"`
	Requested    string `json:"requested,omitempty"`
}

// NodeSide is what one node holds of the volume, from its node plugin.
type NodeSide struct {
	Node       string               `json:"node"`
	Attachment Attachment           `json:"attachment"`
	Staged     *opsapi.StagedVolume `json:"staged,omitempty"`
	// Devices are the node's devices of the volume (a staged one and any
	// read-only views).
	Devices []opsapi.AttachedDevice `json:"devices,omitempty"`
	// Error says why the node plugin could not be asked.
	Error string `json:"error,omitempty"`
}

// PodRef is a pod using the volume's claim.
type PodRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Node      string `json:"node"`
	Phase     string `json:"phase"`
}

// Event is one event of an object in the chain.
type Event struct {
	Object   string    `json:"object"` // kind/name
	Type     string    `json:"type"`
	Reason   string    `json:"reason"`
	Message  string    `json:"message"`
	Count    int32     `json:"count"`
	LastSeen time.Time `json:"lastSeen"`
}

// Describe resolves what (a PVC in namespace, a PV name, or a volume
// handle; "pvc/NAME" and "pv/NAME" say which) and follows the chain; with
// a controller, it adds the background work on the volume's image.
func Describe(ctx context.Context, client kubernetes.Interface, driver, namespace, what string, nodes NodePlugins, controller Controller) (*Description, error) {
	inv, err := readInventory(ctx, client, driver)
	if err != nil {
		return nil, err
	}
	pv, claim, err := resolve(ctx, client, inv, namespace, what)
	if err != nil {
		return nil, err
	}
	desc := &Description{Volume: inv.volumeOf(pv), PVC: claimSummary(claim), Nodes: []NodeSide{}, Pods: []PodRef{}, Events: []Event{}}
	for _, a := range desc.Volume.Attachments {
		desc.Nodes = append(desc.Nodes, nodeSideOf(ctx, client, nodes, a, pv.Spec.CSI.VolumeHandle))
	}
	// The objects whose events belong to the chain, as Kind/name or
	// Kind/namespace/name.
	involved := map[string]bool{"PersistentVolume/" + pv.Name: true}
	for _, a := range desc.Volume.Attachments {
		involved["VolumeAttachment/"+a.Name] = true
	}
	var eventNamespaces []string
	if claim != nil {
		involved["PersistentVolumeClaim/"+claim.Namespace+"/"+claim.Name] = true
		eventNamespaces = append(eventNamespaces, claim.Namespace)
		if desc.Pods, err = podsOfClaim(ctx, client, claim, involved); err != nil {
			return nil, err
		}
	}
	// Cluster-scoped objects' events land in "default".
	eventNamespaces = append(eventNamespaces, metav1.NamespaceDefault)
	if desc.Events, err = eventsOf(ctx, client, eventNamespaces, involved); err != nil {
		return nil, err
	}
	if controller != nil {
		desc.controllerAsked = true
		desc.Background, desc.BackgroundError = backgroundOf(ctx, controller, pv.Spec.CSI.VolumeHandle)
	}
	return desc, nil
}

// backgroundOf is the controller's background work on the volume's image.
func backgroundOf(ctx context.Context, controller Controller, handle string) ([]opsapi.Task, string) {
	imgs, err := controller.Images(ctx)
	if err != nil {
		return nil, err.Error()
	}
	for _, b := range imgs.Backends {
		for _, img := range b.Images {
			if img.VolumeID == handle {
				return img.Tasks, b.TasksError
			}
		}
	}
	return nil, ""
}

// claimSummary summarizes the volume's claim; nil without one.
func claimSummary(claim *corev1.PersistentVolumeClaim) *Claim {
	if claim == nil {
		return nil
	}
	c := &Claim{Namespace: claim.Namespace, Name: claim.Name, Phase: string(claim.Status.Phase)}
	if claim.Spec.StorageClassName != nil {
		c.StorageClass = *claim.Spec.StorageClassName
	}
	if q, ok := claim.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
		c.Requested = q.String()
	}
	return c
}

// nodeSideOf asks the node of attachment a what it holds of the volume.
func nodeSideOf(ctx context.Context, client kubernetes.Interface, nodes NodePlugins, a Attachment, handle string) NodeSide {
	side := NodeSide{Node: a.Node, Attachment: a}
	n, err := client.CoreV1().Nodes().Get(ctx, a.Node, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		side.Error = "the node does not exist"
		return side
	case err != nil:
		side.Error = err.Error()
		return side
	case nodes == nil:
		side.Error = "node plugins not asked"
		return side
	}
	nv, err := nodes.NodeVolumes(ctx, n)
	if err != nil {
		side.Error = err.Error()
		return side
	}
	for i := range nv.Staged {
		if nv.Staged[i].VolumeID == handle {
			s := nv.Staged[i]
			side.Staged = &s
		}
	}
	for _, d := range nv.Devices {
		if d.VolumeID == handle {
			side.Devices = append(side.Devices, d)
		}
	}
	return side
}

// podsOfClaim lists the pods that use claim and adds them to involved.
func podsOfClaim(ctx context.Context, client kubernetes.Interface, claim *corev1.PersistentVolumeClaim, involved map[string]bool) ([]PodRef, error) {
	pods, err := client.CoreV1().Pods(claim.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Pods: %w", err)
	}
	refs := []PodRef{}
	for _, p := range pods.Items {
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim.Name {
				refs = append(refs, PodRef{Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName, Phase: string(p.Status.Phase)})
				involved["Pod/"+p.Namespace+"/"+p.Name] = true
				break
			}
		}
	}
	return refs, nil
}

// eventsOf collects the events of the involved objects from namespaces,
// oldest first.
func eventsOf(ctx context.Context, client kubernetes.Interface, namespaces []string, involved map[string]bool) ([]Event, error) {
	out := []Event{}
	seen := map[string]bool{}
	for _, ns := range namespaces {
		if seen[ns] {
			continue
		}
		seen[ns] = true
		events, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list Events: %w", err)
		}
		for _, e := range events.Items {
			key := e.InvolvedObject.Kind + "/" + e.InvolvedObject.Name
			if e.InvolvedObject.Namespace != "" {
				key = e.InvolvedObject.Kind + "/" + e.InvolvedObject.Namespace + "/" + e.InvolvedObject.Name
			}
			if involved[key] {
				out = append(out, eventOf(&e))
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].LastSeen.Before(out[j].LastSeen) })
	return out, nil
}

// eventOf is one event as describe shows it; an event's time is the last
// it was seen, else when it happened, else when it was recorded.
func eventOf(e *corev1.Event) Event {
	last := e.LastTimestamp.Time
	if last.IsZero() {
		last = e.EventTime.Time
	}
	if last.IsZero() {
		last = e.CreationTimestamp.Time
	}
	return Event{
		Object: strings.ToLower(e.InvolvedObject.Kind) + "/" + e.InvolvedObject.Name,
		Type:   e.Type, Reason: e.Reason, Message: e.Message, Count: e.Count, LastSeen: last,
	}
}

// resolve finds the PV (and its claim, if any) that what names.
func resolve(ctx context.Context, client kubernetes.Interface, inv *inventory, namespace, what string) (*corev1.PersistentVolume, *corev1.PersistentVolumeClaim, error) {
	kind, name, hasKind := strings.Cut(what, "/")
	if hasKind && strings.Count(what, "/") >= 2 {
		hasKind = false // a volume handle: backend/instance/image
	}
	claimOf := func(pv *corev1.PersistentVolume) *corev1.PersistentVolumeClaim {
		if ref := pv.Spec.ClaimRef; ref != nil {
			if c, err := client.CoreV1().PersistentVolumeClaims(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{}); err == nil && c.Spec.VolumeName == pv.Name {
				return c
			}
		}
		return nil
	}
	byPV := func(pvName string) (*corev1.PersistentVolume, *corev1.PersistentVolumeClaim, error) {
		pv := inv.pvByName(pvName)
		if pv == nil {
			return nil, nil, fmt.Errorf("no PersistentVolume %q of this driver", pvName)
		}
		return pv, claimOf(pv), nil
	}
	byPVC := func(claimName string) (*corev1.PersistentVolume, *corev1.PersistentVolumeClaim, error) {
		c, err := client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, claimName, metav1.GetOptions{})
		if err != nil {
			return nil, nil, fmt.Errorf("PersistentVolumeClaim %s/%s: %w", namespace, claimName, err)
		}
		if c.Spec.VolumeName == "" {
			return nil, nil, fmt.Errorf("PersistentVolumeClaim %s/%s is not bound to a volume yet", namespace, claimName)
		}
		pv := inv.pvByName(c.Spec.VolumeName)
		if pv == nil {
			return nil, nil, fmt.Errorf("PersistentVolumeClaim %s/%s is bound to %s, which is not a volume of this driver", namespace, claimName, c.Spec.VolumeName)
		}
		return pv, c, nil
	}
	if hasKind {
		switch strings.ToLower(kind) {
		case "pvc", "persistentvolumeclaim", "persistentvolumeclaims":
			return byPVC(name)
		case "pv", "persistentvolume", "persistentvolumes":
			return byPV(name)
		}
		return nil, nil, fmt.Errorf("%q: describe takes a PVC, a PV (pvc/NAME, pv/NAME) or a volume handle", what)
	}
	for i := range inv.pvs {
		if inv.pvs[i].Spec.CSI.VolumeHandle == what {
			return &inv.pvs[i], claimOf(&inv.pvs[i]), nil
		}
	}
	if strings.Count(what, "/") >= 2 {
		return nil, nil, fmt.Errorf("no PersistentVolume of this driver has the volume handle %q", what)
	}
	// A bare name: a claim in the namespace first, as kubectl users mostly
	// think in claims; then a PV.
	if pv, c, err := byPVC(what); err == nil {
		return pv, c, nil
	}
	if inv.pvByName(what) != nil {
		return byPV(what)
	}
	return nil, nil, fmt.Errorf("%q is neither a PersistentVolumeClaim in namespace %s nor a PersistentVolume of this driver", what, namespace)
}

// printDescription renders the chain for people.
func printDescription(w io.Writer, d *Description, now time.Time) {
	v := d.Volume
	if d.PVC != nil {
		fmt.Fprintf(w, "PVC:        %s/%s (%s", d.PVC.Namespace, d.PVC.Name, d.PVC.Phase)
		if d.PVC.StorageClass != "" {
			fmt.Fprintf(w, ", storage class %s", d.PVC.StorageClass)
		}
		fmt.Fprintln(w, ")")
	} else {
		fmt.Fprintln(w, "PVC:        -")
	}
	fmt.Fprintf(w, "PV:         %s (%s, %s, %s, %s)\n", v.PV, v.Phase, dash(v.Size), strings.Join(v.AccessModes, ","), v.VolumeMode)
	fmt.Fprintf(w, "Volume:     %s\n", v.VolumeHandle)
	fmt.Fprintf(w, "Backend:    %s/%s  image %s\n", dash(v.Backend), dash(v.Instance), v.Image)
	if len(d.Nodes) == 0 {
		fmt.Fprintln(w, "Attachments: none")
	}
	for _, n := range d.Nodes {
		a := n.Attachment
		fmt.Fprintf(w, "Attachment: %s -> node %s: %s for %s\n", a.Name, n.Node, a.State, age(now, a.Since))
		if a.Error != "" {
			fmt.Fprintf(w, "  %sError: %s\n", a.ErrorKind, oneLine(a.Error))
		}
		if len(a.Metadata) > 0 {
			fmt.Fprintf(w, "  attachmentMetadata: %s\n", formatMap(a.Metadata))
		}
		if n.Error != "" {
			fmt.Fprintf(w, "  node plugin: %s\n", n.Error)
			continue
		}
		if s := n.Staged; s != nil {
			fmt.Fprintf(w, "  device:       %s (%s)\n", s.Device, s.DeviceState)
			if s.Encrypted {
				fmt.Fprintf(w, "  encrypted:    LUKS2, dm-crypt mapping %s (%s)\n", s.CryptMapping, s.MapperDevice)
			}
			fmt.Fprintf(w, "  staging path: %s\n", s.StagingPath)
			if s.AccessType == "block" {
				fmt.Fprintln(w, "  mount:        block volume (nothing mounted at the staging path)")
			} else {
				fmt.Fprintf(w, "  mount:        %s, %s, read-only=%t\n", s.MountState, s.FsType, s.ReadOnly)
			}
			for _, p := range s.Publishes {
				fmt.Fprintf(w, "  published at: %s\n", p)
			}
			if s.Problem != "" {
				fmt.Fprintf(w, "  problem:      %s\n", s.Problem)
			}
		} else {
			fmt.Fprintln(w, "  not staged on the node")
		}
		for _, dev := range n.Devices {
			if n.Staged == nil || dev.Device != n.Staged.Device {
				fmt.Fprintf(w, "  other device: %s (read-only=%t)\n", dev.Device, dev.ReadOnly)
			}
		}
	}
	switch {
	case d.BackgroundError != "":
		fmt.Fprintf(w, "Background: unknown (%s)\n", oneLine(d.BackgroundError))
	case len(d.Background) == 0 && d.controllerAsked:
		fmt.Fprintln(w, "Background: none")
	}
	for _, t := range d.Background {
		state := "queued"
		if t.InProgress {
			state = "running"
		}
		progress := ""
		if t.Progress >= 0 {
			progress = fmt.Sprintf(" %.0f%%", 100*t.Progress)
		}
		fmt.Fprintf(w, "Background: %s%s, %s in %s", t.Action, progress, state, t.Runner)
		if t.Message != "" {
			fmt.Fprintf(w, " (%s)", oneLine(t.Message))
		}
		fmt.Fprintln(w)
	}
	if len(d.Pods) == 0 {
		fmt.Fprintln(w, "Pods:       none")
	}
	for _, p := range d.Pods {
		fmt.Fprintf(w, "Pod:        %s/%s on %s (%s)\n", p.Namespace, p.Name, dash(p.Node), p.Phase)
	}
	if len(d.Events) == 0 {
		fmt.Fprintln(w, "Events:     none")
		return
	}
	fmt.Fprintln(w, "Events:")
	for _, e := range d.Events {
		fmt.Fprintf(w, "  %-5s %-8s %s  %s: %s\n", age(now, e.LastSeen), e.Type, e.Object, e.Reason, oneLine(e.Message))
	}
}
