package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/spindle-csi/spindle/internal/node"
	"github.com/spindle-csi/spindle/internal/opsapi"
)

const (
	handleA = "loop/default/pvc-a"
	handleB = "loop/default/pvc-b"
)

// healthyCluster: pvc-a attached to node-1 and staged there, used by a pod.
func healthyCluster() []runtime.Object {
	return objects(
		pv("pvc-a", handleA, "apps", "data-a"), pvc("apps", "data-a", "pvc-a"),
		va("pvc-a", "node-1", attached),
		readyNode("node-1", true), csiNode("node-1"),
		pod("apps", "web-0", "node-1", "data-a"),
	)
}

// clusterWith is healthyCluster with another VolumeAttachment of pvc-a on node-1.
func clusterWith(v *storagev1.VolumeAttachment) []runtime.Object {
	return objects(
		pv("pvc-a", handleA, "apps", "data-a"), pvc("apps", "data-a", "pvc-a"), v,
		readyNode("node-1", true), csiNode("node-1"), pod("apps", "web-0", "node-1", "data-a"),
	)
}

func healthyNode() *opsapi.NodeVolumes {
	return &opsapi.NodeVolumes{
		Node: "node-1",
		Staged: []opsapi.StagedVolume{{
			VolumeID: handleA, Backend: "loop/default", Image: "pvc-a", Device: "/dev/loop3", AccessType: "mount", FsType: "ext4",
			StagingPath: "/var/lib/kubelet/plugins/kubernetes.io/csi/spindle.csi.dev/abc/globalmount",
			MountState:  opsapi.MountStateMounted, DeviceState: opsapi.DeviceStateAttached,
		}},
		Devices: []opsapi.AttachedDevice{{Backend: "loop/default", Image: "pvc-a", VolumeID: handleA, Device: "/dev/loop3"}},
	}
}

func healthyImages() *opsapi.Images {
	return &opsapi.Images{Backends: []opsapi.BackendImages{{Backend: "loop/default", Images: []opsapi.Image{{VolumeID: handleA, Image: "pvc-a"}}}}}
}

func TestDoctorFindings(t *testing.T) {
	type want struct {
		kind, object string
		fix          []string // what the fix must contain
	}
	tests := []struct {
		name       string
		objs       []runtime.Object
		nodes      fakeNodes
		controller Controller
		want       []want
	}{
		{
			name: "healthy cluster", objs: healthyCluster(),
			nodes: fakeNodes{"node-1": healthyNode()}, controller: fakeController{images: healthyImages()},
		},
		{
			name: "deleted attachment still attached",
			objs: clusterWith(va("pvc-a", "node-1", func(v *storagev1.VolumeAttachment) {
				attached(v)
				ts := ago(20 * time.Minute)
				v.DeletionTimestamp = &ts
				v.Finalizers = []string{"external-attacher/spindle-csi-dev"}
			})),
			nodes: fakeNodes{"node-1": healthyNode()},
			want:  []want{{FindingStuckDetach, "volumeattachment/csi-pvc-a-node-1", []string{"kubectl patch volumeattachment csi-pvc-a-node-1", `"finalizers":null`}}},
		},
		{
			name: "a deletion younger than --stuck-after is not stuck",
			objs: clusterWith(va("pvc-a", "node-1", func(v *storagev1.VolumeAttachment) {
				attached(v)
				ts := ago(time.Minute)
				v.DeletionTimestamp = &ts
			})),
			nodes: fakeNodes{"node-1": healthyNode()},
		},
		{
			name: "attached to a node that is gone",
			objs: objects(pv("pvc-a", handleA, "apps", "data-a"), va("pvc-a", "node-gone", attached)),
			want: []want{{FindingNodeGone, "volumeattachment/csi-pvc-a-node-gone", []string{"kubectl delete volumeattachment csi-pvc-a-node-gone"}}},
		},
		{
			name: "attached to a NotReady node",
			objs: objects(pv("pvc-a", handleA, "apps", "data-a"), va("pvc-a", "node-1", attached), readyNode("node-1", false)),
			want: []want{{FindingNodeNotReady, "volumeattachment/csi-pvc-a-node-1", []string{"kubectl taint nodes node-1 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"}}},
		},
		{
			name: "old attach error naming the holder",
			objs: objects(
				pv("pvc-a", handleA, "apps", "data-a"), pvc("apps", "data-a", "pvc-a"),
				va("pvc-a", "node-1", attached), readyNode("node-1", true), readyNode("node-2", true),
				va("pvc-a", "node-2", func(v *storagev1.VolumeAttachment) {
					v.Status.AttachError = &storagev1.VolumeError{Time: ago(30 * time.Minute),
						Message: `rpc error: code = FailedPrecondition desc = volume pvc-a is published to node "node-1"; access mode SINGLE_NODE_WRITER allows one node at a time`}
				}),
				pod("apps", "web-0", "node-1", "data-a"), pod("apps", "web-1", "node-2", "data-a"),
			),
			want: []want{{FindingAttachError, "volumeattachment/csi-pvc-a-node-2", []string{"kubectl delete pod -n apps web-0", "node-1"}}},
		},
		{
			name: "a fresh attach error is not reported",
			objs: objects(pv("pvc-a", handleA, "apps", "data-a"), readyNode("node-2", true),
				va("pvc-a", "node-2", func(v *storagev1.VolumeAttachment) {
					v.Status.AttachError = &storagev1.VolumeError{Time: ago(time.Minute), Message: "transient"}
				})),
		},
		{
			name: "old detach error",
			objs: objects(pv("pvc-a", handleA, "apps", "data-a"), readyNode("node-1", true),
				va("pvc-a", "node-1", func(v *storagev1.VolumeAttachment) {
					attached(v)
					v.Status.DetachError = &storagev1.VolumeError{Time: ago(10 * time.Minute), Message: "loop device /dev/loop3 of volume pvc-a is still in use"}
				})),
			want: []want{{FindingDetachError, "volumeattachment/csi-pvc-a-node-1", []string{"kubectl spindle describe pv pvc-a"}}},
		},
		{
			name:  "PV whose image is missing in the backend",
			objs:  append(healthyCluster(), pv("pvc-b", handleB, "apps", "data-b")),
			nodes: fakeNodes{"node-1": healthyNode()}, controller: fakeController{images: healthyImages()},
			want: []want{{FindingImageMissing, "pv/pvc-b", []string{"kubectl delete pvc -n apps data-b && kubectl delete pv pvc-b"}}},
		},
		{
			name:       "a backend that cannot list its images proves nothing missing",
			objs:       append(healthyCluster(), pv("pvc-b", handleB, "apps", "data-b")),
			nodes:      fakeNodes{"node-1": healthyNode()},
			controller: fakeController{images: &opsapi.Images{Backends: []opsapi.BackendImages{{Backend: "loop/default", Error: "pool directory is not usable"}}}},
		},
		{
			name: "controller unreachable",
			objs: healthyCluster(), nodes: fakeNodes{"node-1": healthyNode()},
			controller: fakeController{err: errors.New("connection refused")},
			want:       []want{{FindingControllerUnreachable, "controller", []string{"kubectl get pods"}}},
		},
		{
			name: "a device no attachment explains",
			objs: healthyCluster(),
			nodes: fakeNodes{"node-1": func() *opsapi.NodeVolumes {
				nv := healthyNode()
				nv.Devices = append(nv.Devices, opsapi.AttachedDevice{Backend: "loop/default", Image: "pvc-old", VolumeID: "loop/default/pvc-old", Device: "/dev/loop7"})
				return nv
			}()},
			want: []want{{FindingUnexplainedDevice, "node/node-1", []string{"on node-1: losetup -d /dev/loop7"}}},
		},
		{
			name: "a staged volume no attachment explains",
			objs: healthyCluster(),
			nodes: fakeNodes{"node-1": func() *opsapi.NodeVolumes {
				nv := healthyNode()
				nv.Staged = append(nv.Staged, opsapi.StagedVolume{
					VolumeID: handleB, Backend: "loop/default", Image: "pvc-b", Device: "/dev/loop5", AccessType: "mount",
					StagingPath: "/var/lib/kubelet/plugins/kubernetes.io/csi/spindle.csi.dev/def/globalmount",
					MountState:  opsapi.MountStateMounted, DeviceState: opsapi.DeviceStateAttached,
				})
				nv.Devices = append(nv.Devices, opsapi.AttachedDevice{Backend: "loop/default", Image: "pvc-b", VolumeID: handleB, Device: "/dev/loop5"})
				return nv
			}()},
			want: []want{{FindingUnexplainedStaging, "node/node-1", []string{
				"umount /var/lib/kubelet/plugins/kubernetes.io/csi/spindle.csi.dev/def/globalmount",
				"losetup -d /dev/loop5",
				"rm /var/lib/kubelet/plugins/kubernetes.io/csi/spindle.csi.dev/def/globalmount.spindle-stage.json",
			}}},
		},
		{
			name: "a staging mount that vanished",
			objs: healthyCluster(),
			nodes: fakeNodes{"node-1": func() *opsapi.NodeVolumes {
				nv := healthyNode()
				nv.Staged[0].MountState, nv.Staged[0].Problem = opsapi.MountStateMissing, "nothing is mounted at the staging path"
				return nv
			}()},
			want: []want{{FindingBrokenStaging, "node/node-1", []string{"kubectl delete pod -n apps web-0"}}},
		},
		{
			name:  "node plugin unreachable",
			objs:  healthyCluster(),
			nodes: fakeNodes{},
			want:  []want{{FindingNodePluginUnreachable, "node/node-1", []string{"spec.nodeName=node-1"}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset(tt.objs...)
			o := DoctorOptions{Driver: testDriver, StuckAfter: 5 * time.Minute, Now: now, Controller: tt.controller}
			if tt.nodes != nil {
				o.Nodes = tt.nodes
			}
			got, err := Doctor(context.Background(), client, o)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("findings:\n%s\nwant %d: %+v", describeFindings(got), len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				f := got[i]
				if f.Kind != w.kind || f.Object != w.object || f.Message == "" {
					t.Errorf("finding %d = %+v, want kind %s on %s with a message", i, f, w.kind, w.object)
				}
				for _, s := range w.fix {
					if !strings.Contains(f.Fix, s) {
						t.Errorf("finding %s: fix %q does not contain %q", f.Kind, f.Fix, s)
					}
				}
			}
			// Doctor reads and never writes.
			for _, a := range client.Actions() {
				if v := a.GetVerb(); v != "list" && v != "get" && v != "watch" {
					t.Errorf("doctor made a %s request on %s", v, a.GetResource().Resource)
				}
			}
		})
	}
}

func describeFindings(fs []Finding) string {
	var b strings.Builder
	printFindings(&b, fs)
	return b.String()
}

// Only the driver's own objects are looked at: another driver's stuck
// attachment is not Spindle's to report.
func TestDoctorIgnoresOtherDrivers(t *testing.T) {
	other := va("pv-ebs", "node-gone", attached)
	other.Spec.Attacher = "ebs.csi.aws.com"
	client := fake.NewClientset(other)
	got, err := Doctor(context.Background(), client, DoctorOptions{Driver: testDriver, StuckAfter: time.Minute, Now: now})
	if err != nil || len(got) != 0 {
		t.Fatalf("Doctor = %+v, %v; want nothing", got, err)
	}
}

func TestPrintFindings(t *testing.T) {
	var b strings.Builder
	printFindings(&b, []Finding{{Kind: FindingNodeGone, Object: "volumeattachment/csi-x", Node: "n9", Message: "attached to n9, which does not exist", Fix: "kubectl delete volumeattachment csi-x"}})
	want := "[NodeGone] volumeattachment/csi-x (node n9): attached to n9, which does not exist\n" +
		"  fix: kubectl delete volumeattachment csi-x\n" +
		"1 problem(s) found. doctor changes nothing; the fixes are for you to run.\n"
	if b.String() != want {
		t.Errorf("printFindings:\n%s\nwant:\n%s", b.String(), want)
	}
	b.Reset()
	printFindings(&b, nil)
	if b.String() != "No problems found.\n" {
		t.Errorf("printFindings(nil) = %q", b.String())
	}
}

// doctor's fixes name the stage record the node plugin really keeps.
func TestStageRecordPathIsTheNodes(t *testing.T) {
	for _, p := range []string{
		"/var/lib/kubelet/plugins/kubernetes.io/csi/spindle.csi.dev/abc/globalmount",
		"/var/lib/kubelet/plugins/kubernetes.io/csi/spindle.csi.dev/abc/globalmount/",
		"/data/kubelet//plugins/x/../y/globalmount",
	} {
		if got, want := stageRecordPath(p), node.StageRecordPath(p); got != want {
			t.Errorf("stageRecordPath(%q) = %q, the node plugin's is %q", p, got, want)
		}
	}
}
