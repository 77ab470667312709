package main

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestMessageShape(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{
			in:   `0/1 nodes are available: persistentvolumeclaim "bench-017" not found. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.`,
			want: `N/N nodes are available: persistentvolumeclaim "bench-N" not found. preemption: N/N nodes are available: N Preemption is not helpful for scheduling.`,
		},
		{
			in:   `MountVolume.MountDevice failed for volume "pvc-0b6f1f43-2a8e-4f7e-9d43-6c1f0e8a9b21" : rpc error: code = Aborted desc = busy after 1.5s`,
			want: `MountVolume.MountDevice failed for volume "pvc-UID" : rpc error: code = Aborted desc = busy after N`,
		},
		{in: "  unchanged message \n", want: "unchanged message"},
	} {
		if got := messageShape(tc.in); got != tc.want {
			t.Errorf("messageShape(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

func TestSummarizeWarningsGroupsAndOrders(t *testing.T) {
	ev := func(reason, msg string, count int32) corev1.Event {
		return corev1.Event{Reason: reason, Message: msg, Count: count}
	}
	got := summarizeWarnings([]corev1.Event{
		ev("FailedMount", `volume "pvc-0b6f1f43-2a8e-4f7e-9d43-6c1f0e8a9b21" busy`, 1),
		ev("FailedScheduling", `claim "bench-001" not found`, 2),
		ev("FailedScheduling", `claim "bench-002" not found`, 0), // Count 0: one event
		ev("FailedScheduling", `unbound immediate claims`, 1),
	})
	want := []warningSummary{
		{reason: "FailedScheduling", count: 4, shapes: []shapeCount{
			{`claim "bench-N" not found`, 3},
			{`unbound immediate claims`, 1},
		}},
		{reason: "FailedMount", count: 1, shapes: []shapeCount{{`volume "pvc-UID" busy`, 1}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("summarizeWarnings:\n got %+v\nwant %+v", got, want)
	}
}
