package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Attachment states, as `volumes` shows them.
const (
	StateAttached  = "attached"
	StateAttaching = "attaching"
	StateDetaching = "detaching"
	StateError     = "error"
)

// Volume is one PV of the driver with what the cluster knows about it.
type Volume struct {
	PV           string       `json:"pv"`
	PVC          string       `json:"pvc,omitempty"` // namespace/name
	VolumeHandle string       `json:"volumeHandle"`
	Backend      string       `json:"backend"`
	Instance     string       `json:"instance"`
	Image        string       `json:"image"`
	Size         string       `json:"size"`
	AccessModes  []string     `json:"accessModes"`
	VolumeMode   string       `json:"volumeMode"`
	Phase        string       `json:"phase"`
	Attachments  []Attachment `json:"attachments"`
}

// Attachment is one VolumeAttachment of a volume.
type Attachment struct {
	Name  string `json:"name"`
	Node  string `json:"node"`
	State string `json:"state"` // attached, attaching, detaching, error
	// Error is the attachError or detachError message; ErrorKind says which.
	Error     string `json:"error,omitempty"`
	ErrorKind string `json:"errorKind,omitempty"` // attach or detach
	// Since is when the state began: the error's time, the deletion's,
	// or the object's creation.
	Since    time.Time         `json:"since"`
	Metadata map[string]string `json:"attachmentMetadata,omitempty"`
}

// splitHandle parses a Spindle volume handle "<backend>/<instance>/<image>";
// a handle of another shape is reported with its backend empty.
func splitHandle(handle string) (backend, instance, image string) {
	parts := strings.SplitN(handle, "/", 3)
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", "", handle
	}
	return parts[0], parts[1], parts[2]
}

// attachmentOf reads a VolumeAttachment's state.
func attachmentOf(va *storagev1.VolumeAttachment) Attachment {
	a := Attachment{Name: va.Name, Node: va.Spec.NodeName, Since: va.CreationTimestamp.Time, Metadata: va.Status.AttachmentMetadata}
	switch {
	case va.DeletionTimestamp != nil && va.Status.DetachError != nil:
		a.State, a.ErrorKind, a.Error, a.Since = StateError, "detach", va.Status.DetachError.Message, va.Status.DetachError.Time.Time
	case va.DeletionTimestamp != nil:
		a.State, a.Since = StateDetaching, va.DeletionTimestamp.Time
	case va.Status.AttachError != nil:
		a.State, a.ErrorKind, a.Error, a.Since = StateError, "attach", va.Status.AttachError.Message, va.Status.AttachError.Time.Time
	case va.Status.DetachError != nil:
		a.State, a.ErrorKind, a.Error, a.Since = StateError, "detach", va.Status.DetachError.Message, va.Status.DetachError.Time.Time
	case va.Status.Attached:
		a.State = StateAttached
	default:
		a.State = StateAttaching
	}
	if a.Since.IsZero() {
		a.Since = va.CreationTimestamp.Time
	}
	return a
}

// inventory is the driver's PVs and VolumeAttachments, read once.
type inventory struct {
	pvs []corev1.PersistentVolume
	// vasByPV are the driver's VolumeAttachments by PV name, sorted by node.
	vasByPV map[string][]storagev1.VolumeAttachment
	vas     []storagev1.VolumeAttachment
}

func readInventory(ctx context.Context, client kubernetes.Interface, driver string) (*inventory, error) {
	pvList, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list PersistentVolumes: %w", err)
	}
	vaList, err := client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list VolumeAttachments: %w", err)
	}
	inv := &inventory{vasByPV: map[string][]storagev1.VolumeAttachment{}}
	for _, pv := range pvList.Items {
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == driver {
			inv.pvs = append(inv.pvs, pv)
		}
	}
	sort.Slice(inv.pvs, func(i, j int) bool { return inv.pvs[i].Name < inv.pvs[j].Name })
	for _, va := range vaList.Items {
		if va.Spec.Attacher != driver {
			continue
		}
		inv.vas = append(inv.vas, va)
		if pv := va.Spec.Source.PersistentVolumeName; pv != nil {
			inv.vasByPV[*pv] = append(inv.vasByPV[*pv], va)
		}
	}
	for _, vas := range inv.vasByPV {
		sort.Slice(vas, func(i, j int) bool { return vas[i].Spec.NodeName < vas[j].Spec.NodeName })
	}
	sort.Slice(inv.vas, func(i, j int) bool { return inv.vas[i].Name < inv.vas[j].Name })
	return inv, nil
}

func (inv *inventory) pvByName(name string) *corev1.PersistentVolume {
	for i := range inv.pvs {
		if inv.pvs[i].Name == name {
			return &inv.pvs[i]
		}
	}
	return nil
}

// volumeOf describes one PV.
func (inv *inventory) volumeOf(pv *corev1.PersistentVolume) Volume {
	handle := pv.Spec.CSI.VolumeHandle
	backend, instance, image := splitHandle(handle)
	v := Volume{
		PV: pv.Name, VolumeHandle: handle, Backend: backend, Instance: instance, Image: image,
		Phase: string(pv.Status.Phase), VolumeMode: string(corev1.PersistentVolumeFilesystem),
		Attachments: []Attachment{},
	}
	if pv.Spec.VolumeMode != nil {
		v.VolumeMode = string(*pv.Spec.VolumeMode)
	}
	if ref := pv.Spec.ClaimRef; ref != nil {
		v.PVC = ref.Namespace + "/" + ref.Name
	}
	if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
		v.Size = q.String()
	}
	for _, m := range pv.Spec.AccessModes {
		v.AccessModes = append(v.AccessModes, string(m))
	}
	for i := range inv.vasByPV[pv.Name] {
		v.Attachments = append(v.Attachments, attachmentOf(&inv.vasByPV[pv.Name][i]))
	}
	return v
}

// Volumes lists the driver's PVs; with namespace set, only those claimed
// from that namespace.
func Volumes(ctx context.Context, client kubernetes.Interface, driver, namespace string) ([]Volume, error) {
	inv, err := readInventory(ctx, client, driver)
	if err != nil {
		return nil, err
	}
	out := []Volume{}
	for i := range inv.pvs {
		pv := &inv.pvs[i]
		if namespace != "" && (pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Namespace != namespace) {
			continue
		}
		out = append(out, inv.volumeOf(pv))
	}
	return out, nil
}

// accessModeShort abbreviates access modes as kubectl get pv does.
var accessModeShort = map[string]string{
	"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX", "ReadWriteOncePod": "RWOP",
}

// printVolumesTable prints one line per VolumeAttachment of each volume
// (one line with node "-" for a volume attached nowhere).
func printVolumesTable(w io.Writer, vols []Volume, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PV\tPVC\tBACKEND\tIMAGE\tSIZE\tACCESS\tNODE\tSTATE\tAGE\tATTACHMENT-METADATA\tMESSAGE")
	for _, v := range vols {
		var modes []string
		for _, m := range v.AccessModes {
			if s, ok := accessModeShort[m]; ok {
				m = s
			}
			modes = append(modes, m)
		}
		backend := v.Backend + "/" + v.Instance
		if v.Backend == "" {
			backend = "?"
		}
		prefix := strings.Join([]string{v.PV, dash(v.PVC), backend, v.Image, dash(v.Size), dash(strings.Join(modes, ","))}, "\t")
		if len(v.Attachments) == 0 {
			fmt.Fprintf(tw, "%s\t-\tdetached\t-\t-\t-\n", prefix)
			continue
		}
		for _, a := range v.Attachments {
			msg := "-"
			if a.Error != "" {
				msg = a.ErrorKind + "Error: " + oneLine(a.Error)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", prefix, a.Node, a.State, age(now, a.Since), dash(formatMap(a.Metadata)), msg)
		}
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// formatMap renders k=v pairs sorted by key.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		v := m[k]
		if strings.HasPrefix(k, "encryption") && strings.HasSuffix(k, "WrappedKey") {
			// An encrypted volume's wrapped key: long, and of no use to read.
			v = fmt.Sprintf("(wrapped, %d bytes)", len(v))
		}
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

// age renders a duration as kubectl does: 45s, 12m, 3h, 5d.
func age(now, since time.Time) string {
	if since.IsZero() {
		return "-"
	}
	d := now.Sub(since)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
