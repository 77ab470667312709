package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// volumesCluster has one volume per attachment state, a volume attached
// nowhere, and a PV of another driver.
func volumesCluster() []runtime.Object {
	notSpindle := pv("pv-nfs", "nfs-server:/export", "", "")
	notSpindle.Spec.CSI.Driver = "nfs.csi.k8s.io"
	return objects(
		pv("pvc-a", "loop/default/pvc-a", "apps", "data-a"),
		va("pvc-a", "node-1", attached),
		va("pvc-a", "node-2", func(v *storagev1.VolumeAttachment) {
			v.Status.AttachError = &storagev1.VolumeError{Time: ago(7 * time.Minute),
				Message: "rpc error: code = FailedPrecondition desc = volume pvc-a is published to node \"node-1\";\n access mode SINGLE_NODE_WRITER allows one node at a time"}
		}),
		pv("pvc-b", "loop/fast/pvc-b", "db", "data-b"),
		va("pvc-b", "node-1", func(v *storagev1.VolumeAttachment) { v.CreationTimestamp = ago(30 * time.Second) }),
		pv("pvc-c", "loop/default/pvc-c", "db", "data-c"),
		va("pvc-c", "node-1", func(v *storagev1.VolumeAttachment) {
			attached(v)
			ts := ago(3 * time.Hour)
			v.DeletionTimestamp = &ts
			v.Finalizers = []string{"external-attacher/spindle-csi-dev"}
		}),
		pv("pvc-d", "loop/default/pvc-d", "", ""),
		notSpindle,
	)
}

func TestVolumesTable(t *testing.T) {
	client := fake.NewClientset(volumesCluster()...)
	vols, err := Volumes(context.Background(), client, testDriver, "")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := printVolumesTable(&b, vols, now); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	header := strings.Fields(lines[0])
	wantHeader := []string{"PV", "PVC", "BACKEND", "IMAGE", "SIZE", "ACCESS", "NODE", "STATE", "AGE", "ATTACHMENT-METADATA", "MESSAGE"}
	if strings.Join(header, " ") != strings.Join(wantHeader, " ") {
		t.Fatalf("header = %v, want %v", header, wantHeader)
	}
	// Each row, column by column; the message column runs to the end of the line.
	want := [][]string{
		{"pvc-a", "apps/data-a", "loop/default", "pvc-a", "1Gi", "RWO", "node-1", "attached", "60m", "imagePath=/pool/pvc-a.img", "-"},
		{"pvc-a", "apps/data-a", "loop/default", "pvc-a", "1Gi", "RWO", "node-2", "error", "7m", "-",
			`attachError: rpc error: code = FailedPrecondition desc = volume pvc-a is published to node "node-1"; access mode SINGLE_NODE_WRITER allows one node at a time`},
		{"pvc-b", "db/data-b", "loop/fast", "pvc-b", "1Gi", "RWO", "node-1", "attaching", "30s", "-", "-"},
		{"pvc-c", "db/data-c", "loop/default", "pvc-c", "1Gi", "RWO", "node-1", "detaching", "3h", "imagePath=/pool/pvc-c.img", "-"},
		{"pvc-d", "-", "loop/default", "pvc-d", "1Gi", "RWO", "-", "detached", "-", "-", "-"},
	}
	rows := lines[1:]
	if len(rows) != len(want) {
		t.Fatalf("table has %d rows, want %d:\n%s", len(rows), len(want), b.String())
	}
	for i, row := range rows {
		fields := strings.Fields(row)
		n := len(wantHeader) - 1
		if len(fields) < n {
			t.Errorf("row %d has %d columns: %q", i, len(fields), row)
			continue
		}
		got := append(fields[:n:n], strings.Join(fields[n:], " "))
		if strings.Join(got, "|") != strings.Join(want[i], "|") {
			t.Errorf("row %d:\n got  %q\n want %q", i, got, want[i])
		}
	}
}

func TestVolumesNamespaceFilter(t *testing.T) {
	client := fake.NewClientset(volumesCluster()...)
	vols, err := Volumes(context.Background(), client, testDriver, "db")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range vols {
		names = append(names, v.PV)
	}
	if strings.Join(names, ",") != "pvc-b,pvc-c" {
		t.Errorf("volumes in namespace db = %v, want pvc-b,pvc-c", names)
	}
}

func TestAttachmentStates(t *testing.T) {
	deleted := ago(2 * time.Minute)
	tests := []struct {
		name      string
		status    storagev1.VolumeAttachmentStatus
		deletion  *metav1.Time
		state     string
		errorKind string
		since     time.Time
	}{
		{"attached", storagev1.VolumeAttachmentStatus{Attached: true}, nil, StateAttached, "", now.Add(-time.Hour)},
		{"attaching", storagev1.VolumeAttachmentStatus{}, nil, StateAttaching, "", now.Add(-time.Hour)},
		{"attach error", storagev1.VolumeAttachmentStatus{AttachError: &storagev1.VolumeError{Time: ago(time.Minute), Message: "x"}}, nil, StateError, "attach", now.Add(-time.Minute)},
		{"detaching", storagev1.VolumeAttachmentStatus{Attached: true}, &deleted, StateDetaching, "", deleted.Time},
		{"detach error while deleting", storagev1.VolumeAttachmentStatus{Attached: true, DetachError: &storagev1.VolumeError{Time: ago(time.Second), Message: "busy"}}, &deleted, StateError, "detach", now.Add(-time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := va("pv", "n", func(v *storagev1.VolumeAttachment) { v.Status, v.DeletionTimestamp = tt.status, tt.deletion })
			a := attachmentOf(v)
			if a.State != tt.state || a.ErrorKind != tt.errorKind || !a.Since.Equal(tt.since) {
				t.Errorf("attachmentOf = state %s kind %q since %v; want %s %q %v", a.State, a.ErrorKind, a.Since, tt.state, tt.errorKind, tt.since)
			}
		})
	}
}

func TestSplitHandle(t *testing.T) {
	for handle, want := range map[string][3]string{
		"loop/default/pvc-1":      {"loop", "default", "pvc-1"},
		"rbd/ceph-a/kube/csi-vol": {"rbd", "ceph-a", "kube/csi-vol"},
		"not-spindle":             {"", "", "not-spindle"},
	} {
		b, i, img := splitHandle(handle)
		if [3]string{b, i, img} != want {
			t.Errorf("splitHandle(%q) = %q %q %q, want %q", handle, b, i, img, want)
		}
	}
}
