package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/spindle-csi/spindle/internal/opsapi"
)

// Kinds of doctor findings.
const (
	FindingStuckDetach           = "StuckDetach"           // deleted VolumeAttachment still attached
	FindingNodeGone              = "NodeGone"              // VolumeAttachment to a node that does not exist
	FindingNodeNotReady          = "NodeNotReady"          // volume attached to a NotReady node
	FindingAttachError           = "AttachError"           // attachError older than --stuck-after
	FindingDetachError           = "DetachError"           // detachError older than --stuck-after
	FindingImageMissing          = "ImageMissing"          // PV whose image the backend does not have
	FindingUnexplainedDevice     = "UnexplainedDevice"     // device on a node that no VolumeAttachment explains
	FindingUnexplainedStaging    = "UnexplainedStaging"    // staged volume that no VolumeAttachment explains
	FindingBrokenStaging         = "BrokenStaging"         // staged volume whose mount or device is gone
	FindingNodePluginUnreachable = "NodePluginUnreachable" // a node's /volumes could not be read
	FindingControllerUnreachable = "ControllerUnreachable" // the controller's /images could not be read
)

// Finding is one problem doctor found, with the command that would fix it.
// Doctor itself never runs it.
type Finding struct {
	Kind    string `json:"kind"`
	Object  string `json:"object"` // volumeattachment/NAME, pv/NAME, node/NAME
	Node    string `json:"node,omitempty"`
	Volume  string `json:"volume,omitempty"` // the volume handle
	Message string `json:"message"`
	Fix     string `json:"fix"`
}

// DoctorOptions tune the checks.
type DoctorOptions struct {
	Driver string
	// StuckAfter is how old an attach/detach error, or a deletion that
	// has not detached, must be to count as stuck.
	StuckAfter time.Duration
	Now        time.Time
	Nodes      NodePlugins // nil: no per-node checks
	Controller Controller  // nil: no image check
}

// Doctor runs every check; it only reads.
func Doctor(ctx context.Context, client kubernetes.Interface, o DoctorOptions) ([]Finding, error) {
	inv, err := readInventory(ctx, client, o.Driver)
	if err != nil {
		return nil, err
	}
	nodeList, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Nodes: %w", err)
	}
	nodes := map[string]*corev1.Node{}
	for i := range nodeList.Items {
		nodes[nodeList.Items[i].Name] = &nodeList.Items[i]
	}
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Pods: %w", err)
	}
	d := &doctor{o: o, inv: inv, nodes: nodes, pods: pods.Items}
	d.checkAttachments()
	if o.Controller != nil {
		d.checkImages(ctx)
	}
	if o.Nodes != nil {
		if err := d.checkNodes(ctx, client); err != nil {
			return nil, err
		}
	}
	return d.findings, nil
}

type doctor struct {
	o        DoctorOptions
	inv      *inventory
	nodes    map[string]*corev1.Node
	pods     []corev1.Pod
	findings []Finding
}

func (d *doctor) add(f Finding) { d.findings = append(d.findings, f) }

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (d *doctor) handleOf(va *storagev1.VolumeAttachment) string {
	if va.Spec.Source.PersistentVolumeName == nil {
		return ""
	}
	if pv := d.inv.pvByName(*va.Spec.Source.PersistentVolumeName); pv != nil {
		return pv.Spec.CSI.VolumeHandle
	}
	return ""
}

// heldBy finds the node a refused attach names as the volume's holder
// (`... is published to node "node-a" ...`).
var heldBy = regexp.MustCompile(`node "([^"]+)"`)

// podsUsing lists the pods (namespace/name) on nodeName that use the PV's
// claim; any node when nodeName is "".
func (d *doctor) podsUsing(pv *corev1.PersistentVolume, nodeName string) []corev1.Pod {
	if pv == nil || pv.Spec.ClaimRef == nil {
		return nil
	}
	var out []corev1.Pod
	for _, p := range d.pods {
		if p.Namespace != pv.Spec.ClaimRef.Namespace || (nodeName != "" && p.Spec.NodeName != nodeName) {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == pv.Spec.ClaimRef.Name {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

func deletePodsCommand(pods []corev1.Pod) string {
	var cmds []string
	for _, p := range pods {
		cmds = append(cmds, fmt.Sprintf("kubectl delete pod -n %s %s", p.Namespace, p.Name))
	}
	return strings.Join(cmds, " && ")
}

func removeFinalizers(va string) string {
	return fmt.Sprintf(`kubectl patch volumeattachment %s --type=merge -p '{"metadata":{"finalizers":null}}'`, va)
}

func (d *doctor) checkAttachments() {
	for i := range d.inv.vas {
		va := &d.inv.vas[i]
		obj := "volumeattachment/" + va.Name
		nodeName := va.Spec.NodeName
		handle := d.handleOf(va)
		n, nodeExists := d.nodes[nodeName]
		switch {
		case !nodeExists:
			fix := "kubectl delete volumeattachment " + va.Name
			if va.DeletionTimestamp != nil {
				fix = removeFinalizers(va.Name) + "   # the node is gone, nothing can detach there"
			}
			d.add(Finding{Kind: FindingNodeGone, Object: obj, Node: nodeName, Volume: handle,
				Message: fmt.Sprintf("attached (attached=%t) to node %s, which does not exist", va.Status.Attached, nodeName), Fix: fix})
			continue // the node's absence explains everything else about it
		case va.Status.Attached && !nodeReady(n):
			d.add(Finding{Kind: FindingNodeNotReady, Object: obj, Node: nodeName, Volume: handle,
				Message: fmt.Sprintf("volume is attached to node %s, which is NotReady; it cannot move to another node until the node is back or declared out of service", nodeName),
				Fix:     fmt.Sprintf("kubectl taint nodes %s node.kubernetes.io/out-of-service=nodeshutdown:NoExecute   # only if the node is really shut down", nodeName)})
		}
		if va.DeletionTimestamp != nil && va.Status.Attached && d.o.Now.Sub(va.DeletionTimestamp.Time) >= d.o.StuckAfter {
			d.add(Finding{Kind: FindingStuckDetach, Object: obj, Node: nodeName, Volume: handle,
				Message: fmt.Sprintf("deleted %s ago but still attached to %s", age(d.o.Now, va.DeletionTimestamp.Time), nodeName),
				Fix:     "kubectl describe volumeattachment " + va.Name + "   # then, once " + nodeName + " no longer uses the volume: " + removeFinalizers(va.Name)})
		}
		if e := va.Status.AttachError; e != nil && va.DeletionTimestamp == nil && d.o.Now.Sub(e.Time.Time) >= d.o.StuckAfter {
			fix := "kubectl delete volumeattachment " + va.Name + "   # the attach-detach controller recreates it and the attach is retried"
			pv := d.pvOf(va)
			if m := heldBy.FindStringSubmatch(e.Message); m != nil && m[1] != nodeName {
				if pods := d.podsUsing(pv, m[1]); len(pods) > 0 {
					fix = deletePodsCommand(pods) + "   # they hold the volume on " + m[1]
				} else {
					fix = fmt.Sprintf("kubectl spindle describe pv %s   # find what still holds the volume on %s", pvName(pv), m[1])
				}
			}
			d.add(Finding{Kind: FindingAttachError, Object: obj, Node: nodeName, Volume: handle,
				Message: fmt.Sprintf("attach to %s failing for %s: %s", nodeName, age(d.o.Now, e.Time.Time), oneLine(e.Message)), Fix: fix})
		}
		if e := va.Status.DetachError; e != nil && d.o.Now.Sub(e.Time.Time) >= d.o.StuckAfter {
			d.add(Finding{Kind: FindingDetachError, Object: obj, Node: nodeName, Volume: handle,
				Message: fmt.Sprintf("detach from %s failing for %s: %s", nodeName, age(d.o.Now, e.Time.Time), oneLine(e.Message)),
				Fix:     "kubectl spindle describe pv " + pvName(d.pvOf(va)) + "   # see what still uses the volume on " + nodeName})
		}
	}
}

func (d *doctor) pvOf(va *storagev1.VolumeAttachment) *corev1.PersistentVolume {
	if va.Spec.Source.PersistentVolumeName == nil {
		return nil
	}
	return d.inv.pvByName(*va.Spec.Source.PersistentVolumeName)
}

func pvName(pv *corev1.PersistentVolume) string {
	if pv == nil {
		return "<pv>"
	}
	return pv.Name
}

func (d *doctor) checkImages(ctx context.Context) {
	imgs, err := d.o.Controller.Images(ctx)
	if err != nil {
		d.add(Finding{Kind: FindingControllerUnreachable, Object: "controller", Message: err.Error(),
			Fix: unreachableFix(err, "kubectl get pods -A -l app.kubernetes.io/name=spindle,app.kubernetes.io/component=controller -o wide   # is the controller running, with --metrics-address?")})
		return
	}
	known := map[string]map[string]bool{} // instance key -> volume IDs
	for _, b := range imgs.Backends {
		if b.Error != "" {
			continue // an unreadable list proves nothing missing
		}
		ids := map[string]bool{}
		for _, img := range b.Images {
			ids[img.VolumeID] = true
		}
		known[b.Backend] = ids
	}
	for _, pv := range d.inv.pvs {
		handle := pv.Spec.CSI.VolumeHandle
		backend, instance, _ := splitHandle(handle)
		ids, ok := known[backend+"/"+instance]
		if !ok || ids[handle] {
			continue
		}
		fix := "kubectl delete pv " + pv.Name
		if ref := pv.Spec.ClaimRef; ref != nil && pv.Status.Phase == corev1.VolumeBound {
			fix = fmt.Sprintf("kubectl delete pvc -n %s %s && kubectl delete pv %s", ref.Namespace, ref.Name, pv.Name)
		}
		d.add(Finding{Kind: FindingImageMissing, Object: "pv/" + pv.Name, Volume: handle,
			Message: fmt.Sprintf("backend %s/%s has no image %s; the volume's data is gone", backend, instance, handle),
			Fix:     fix + "   # after making sure the data is not needed or restored"})
	}
}

// checkNodes reads every node plugin's /volumes: nodes whose CSINode lists
// the driver.
func (d *doctor) checkNodes(ctx context.Context, client kubernetes.Interface) error {
	csiNodes, err := client.StorageV1().CSINodes().List(ctx, metav1.ListOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("list CSINodes: %w", err)
	}
	var names []string
	if csiNodes != nil {
		for _, cn := range csiNodes.Items {
			for _, drv := range cn.Spec.Drivers {
				if drv.Name == d.o.Driver {
					names = append(names, cn.Name)
				}
			}
		}
	}
	sort.Strings(names)
	// What the cluster says each node should hold: volume handles with a
	// VolumeAttachment to it (attached, attaching or detaching).
	explained := map[string]map[string]bool{}
	for i := range d.inv.vas {
		va := &d.inv.vas[i]
		if h := d.handleOf(va); h != "" {
			if explained[va.Spec.NodeName] == nil {
				explained[va.Spec.NodeName] = map[string]bool{}
			}
			explained[va.Spec.NodeName][h] = true
		}
	}
	for _, name := range names {
		n, ok := d.nodes[name]
		if !ok {
			continue
		}
		nv, err := d.o.Nodes.NodeVolumes(ctx, n)
		if err != nil {
			d.add(Finding{Kind: FindingNodePluginUnreachable, Object: "node/" + name, Node: name, Message: err.Error(),
				Fix: unreachableFix(err, fmt.Sprintf("kubectl get pods -A -o wide --field-selector spec.nodeName=%s | grep spindle   # is the node plugin running with --metrics-address?", name))})
			continue
		}
		d.checkNode(name, nv, explained[name])
	}
	return nil
}

// unreachableFix is the fix for an endpoint that could not be read: the
// RBAC rule that is missing when that was the reason, else fallback.
func unreachableFix(err error, fallback string) string {
	var pe *PermissionError
	if errors.As(err, &pe) {
		return pe.Fix()
	}
	return fallback
}

func (d *doctor) checkNode(name string, nv *opsapi.NodeVolumes, explained map[string]bool) {
	staged := map[string]bool{}
	for _, s := range nv.Staged {
		staged[s.VolumeID] = true
		if !explained[s.VolumeID] {
			d.add(Finding{Kind: FindingUnexplainedStaging, Object: "node/" + name, Node: name, Volume: s.VolumeID,
				Message: fmt.Sprintf("%s is staged at %s (device %s) but no VolumeAttachment attaches it to %s", s.VolumeID, s.StagingPath, s.Device, name),
				Fix:     "on " + name + ": " + cleanupStagingCommand(s)})
			continue
		}
		if broken := (s.AccessType != "block" && s.MountState != opsapi.MountStateMounted) || s.DeviceState != opsapi.DeviceStateAttached; broken {
			fix := "on " + name + ": umount -l " + s.StagingPath + "   # then restart the volume's pods on " + name
			if pods := d.podsUsing(d.pvByHandle(s.VolumeID), name); len(pods) > 0 {
				fix = deletePodsCommand(pods) + "   # kubelet stages the volume again for the new pods"
			}
			d.add(Finding{Kind: FindingBrokenStaging, Object: "node/" + name, Node: name, Volume: s.VolumeID,
				Message: fmt.Sprintf("%s at %s: mount %s, device %s %s: %s", s.VolumeID, s.StagingPath, dash(s.MountState), s.Device, s.DeviceState, s.Problem),
				Fix:     fix})
		}
	}
	for _, dev := range nv.Devices {
		if explained[dev.VolumeID] {
			continue
		}
		what := "no VolumeAttachment attaches " + dev.VolumeID + " to " + name
		if dev.ImageDeleted {
			what = "its image was deleted"
		}
		if staged[dev.VolumeID] {
			continue // reported with its staging path above
		}
		d.add(Finding{Kind: FindingUnexplainedDevice, Object: "node/" + name, Node: name, Volume: dev.VolumeID,
			Message: fmt.Sprintf("%s holds %s for %s, but %s", name, dev.Device, dev.VolumeID, what),
			Fix:     "on " + name + ": " + detachCommand(dev.Backend, dev.Device)})
	}
}

func (d *doctor) pvByHandle(handle string) *corev1.PersistentVolume {
	for i := range d.inv.pvs {
		if d.inv.pvs[i].Spec.CSI.VolumeHandle == handle {
			return &d.inv.pvs[i]
		}
	}
	return nil
}

// detachCommand releases one device of a backend by hand.
func detachCommand(backendKey, device string) string {
	backend, _, _ := strings.Cut(backendKey, "/")
	switch backend {
	case "loop":
		return "losetup -d " + device
	case "rbd":
		return "rbd device unmap " + device
	case "iscsi":
		return "iscsiadm -m session   # find the session of " + device + ", then iscsiadm -m node -T <target> -p <portal> -u"
	}
	return "# release " + device + " with the " + backend + " backend's tools"
}

// cleanupStagingCommand undoes a stage by hand: what NodeUnstageVolume does.
func cleanupStagingCommand(s opsapi.StagedVolume) string {
	var steps []string
	if s.AccessType != "block" && s.MountState != opsapi.MountStateMissing {
		steps = append(steps, "umount "+s.StagingPath)
	}
	if s.DeviceState == opsapi.DeviceStateAttached {
		steps = append(steps, detachCommand(s.Backend, s.Device))
	}
	steps = append(steps, "rm "+stageRecordPath(s.StagingPath))
	return strings.Join(steps, " && ")
}

// printFindings prints each finding with its fix, or that all is well.
func printFindings(w io.Writer, findings []Finding) {
	if len(findings) == 0 {
		fmt.Fprintln(w, "No problems found.")
		return
	}
	for _, f := range findings {
		where := f.Object
		if f.Node != "" && !strings.HasPrefix(f.Object, "node/") {
			where += " (node " + f.Node + ")"
		}
		fmt.Fprintf(w, "[%s] %s: %s\n  fix: %s\n", f.Kind, where, f.Message, f.Fix)
	}
	fmt.Fprintf(w, "%d problem(s) found. doctor changes nothing; the fixes are for you to run.\n", len(findings))
}

// stageRecordPath is where the node plugin keeps the record of a stage,
// as internal/node.StageRecordPath says (a test pins the two together).
// Not that function itself: internal/node builds on Linux only, and the
// plugin runs on the operators' machines, whatever they are; the path is
// a Linux path on the node, hence package path and not filepath.
func stageRecordPath(stagingPath string) string {
	clean := path.Clean(stagingPath)
	return path.Join(path.Dir(clean), path.Base(clean)+".spindle-stage.json")
}
