package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/spindle-csi/spindle/internal/opsapi"
)

func event(ns, kind, objNS, name, reason, msg string, at time.Duration) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: ns, Name: name + "." + reason},
		InvolvedObject: corev1.ObjectReference{Kind: kind, Namespace: objNS, Name: name},
		Type:           corev1.EventTypeNormal, Reason: reason, Message: msg, Count: 1, LastTimestamp: ago(at),
	}
}

func describeCluster() []runtime.Object {
	return append(healthyCluster(),
		pod("apps", "unrelated", "node-1", "other-claim"),
		event("apps", "PersistentVolumeClaim", "apps", "data-a", "ProvisioningSucceeded", "Successfully provisioned volume pvc-a", 2*time.Hour),
		event("apps", "Pod", "apps", "web-0", "SuccessfulAttachVolume", `AttachVolume.Attach succeeded for volume "pvc-a"`, time.Hour),
		event("apps", "Pod", "apps", "unrelated", "Pulled", "not about the volume", time.Minute),
	)
}

// describe follows the chain to the node's device and staging path, the
// pods using the claim and their events, whichever name it is given.
func TestDescribeFollowsTheChain(t *testing.T) {
	for _, what := range []string{"data-a", "pvc/data-a", "pv/pvc-a", "pvc-a", handleA} {
		t.Run(what, func(t *testing.T) {
			client := fake.NewClientset(describeCluster()...)
			d, err := Describe(context.Background(), client, testDriver, "apps", what, fakeNodes{"node-1": healthyNode()}, fakeController{images: healthyImages()})
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			printDescription(&b, d, now)
			out := b.String()
			for _, want := range []string{
				"PVC:        apps/data-a (Bound)",
				"PV:         pvc-a (Bound, 1Gi, ReadWriteOnce, Filesystem)",
				"Volume:     loop/default/pvc-a",
				"Backend:    loop/default  image pvc-a",
				"Attachment: csi-pvc-a-node-1 -> node node-1: attached for 60m",
				"  attachmentMetadata: imagePath=/pool/pvc-a.img",
				"  device:       /dev/loop3 (attached)",
				"  staging path: /var/lib/kubelet/plugins/kubernetes.io/csi/spindle.csi.dev/abc/globalmount",
				"  mount:        mounted, ext4, read-only=false",
				"Background: none",
				"Pod:        apps/web-0 on node-1 (Running)",
				"persistentvolumeclaim/data-a  ProvisioningSucceeded: Successfully provisioned volume pvc-a",
				`pod/web-0  SuccessfulAttachVolume: AttachVolume.Attach succeeded for volume "pvc-a"`,
			} {
				if !strings.Contains(out, want+"\n") && !strings.Contains(out, want) {
					t.Errorf("describe output lacks %q:\n%s", want, out)
				}
			}
			if strings.Contains(out, "unrelated") || strings.Contains(out, "not about the volume") {
				t.Errorf("describe shows a pod or event that has nothing to do with the volume:\n%s", out)
			}
		})
	}
}

func TestDescribeNodePluginDown(t *testing.T) {
	client := fake.NewClientset(describeCluster()...)
	d, err := Describe(context.Background(), client, testDriver, "apps", "data-a", fakeNodes{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Nodes) != 1 || !strings.Contains(d.Nodes[0].Error, "connection refused") || d.Nodes[0].Staged != nil {
		t.Errorf("node side = %+v; want the node plugin's error and no staged volume", d.Nodes)
	}
}

func TestDescribeUnknown(t *testing.T) {
	client := fake.NewClientset(describeCluster()...)
	for what, want := range map[string]string{
		"nope":                 "neither a PersistentVolumeClaim",
		"loop/default/pvc-zzz": "no PersistentVolume of this driver has the volume handle",
		"pv/pvc-zzz":           `no PersistentVolume "pvc-zzz"`,
		"svc/x":                "describe takes a PVC",
	} {
		if _, err := Describe(context.Background(), client, testDriver, "apps", what, nil, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Describe(%q) = %v, want an error with %q", what, err, want)
		}
	}
}

// describe shows the controller's background work on the volume's image
// (a flatten of a deep copy-on-write clone), with its progress, and says
// when the controller could not be asked.
func TestDescribeShowsBackgroundWork(t *testing.T) {
	client := fake.NewClientset(describeCluster()...)
	imgs := healthyImages()
	imgs.Backends[0].Images[0].Tasks = []opsapi.Task{{Action: "flatten", Image: "pvc-a", Progress: 0.42, InProgress: true, Runner: "ceph-mgr", Message: "Flattening image kube/csi-vol-1"}}
	for _, tc := range []struct {
		controller Controller
		want       string
	}{
		{fakeController{images: imgs}, "Background: flatten 42%, running in ceph-mgr (Flattening image kube/csi-vol-1)\n"},
		{fakeController{err: errors.New("connection refused")}, "Background: unknown (connection refused)\n"},
	} {
		d, err := Describe(context.Background(), client, testDriver, "apps", "data-a", fakeNodes{"node-1": healthyNode()}, tc.controller)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		printDescription(&b, d, now)
		if !strings.Contains(b.String(), tc.want) {
			t.Errorf("describe output lacks %q:\n%s", tc.want, b.String())
		}
	}
}
