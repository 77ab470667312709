package metrics

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The background-task gauges: one progress series per task, counts by
// backend, action and state, and a scrape error counted when a backend
// cannot list its tasks (what it did list is still shown).
func TestBackgroundTaskGauges(t *testing.T) {
	m := New()
	m.SetBackgroundTasks(func() ([]BackgroundTask, error) {
		return []BackgroundTask{
			{Backend: "rbd/ceph-a", Action: "flatten", Image: "kube/csi-snap-1", Progress: 0.25, InProgress: true},
			{Backend: "rbd/ceph-a", Action: "flatten", Image: "kube/csi-vol-2", Progress: 0},
			{Backend: "rbd/ceph-a", Action: "remove", Image: "kube/1234abcd (trash)", Progress: -1},
		}, errors.New("rbd/ceph-b: ceph rbd task list: timed out")
	})
	want := `
# HELP spindle_background_task_progress_ratio Fraction done of each background task, 0 to 1 (-1 when its runner does not say), by backend instance, action and image.
# TYPE spindle_background_task_progress_ratio gauge
spindle_background_task_progress_ratio{action="flatten",backend="rbd/ceph-a",image="kube/csi-snap-1"} 0.25
spindle_background_task_progress_ratio{action="flatten",backend="rbd/ceph-a",image="kube/csi-vol-2"} 0
spindle_background_task_progress_ratio{action="remove",backend="rbd/ceph-a",image="kube/1234abcd (trash)"} -1
# HELP spindle_background_tasks Background work of the controller's backends (flattening a copy-on-write clone, removing a deleted image), by backend instance, action and state (running, queued).
# TYPE spindle_background_tasks gauge
spindle_background_tasks{action="flatten",backend="rbd/ceph-a",state="queued"} 1
spindle_background_tasks{action="flatten",backend="rbd/ceph-a",state="running"} 1
spindle_background_tasks{action="remove",backend="rbd/ceph-a",state="queued"} 1
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "spindle_background_tasks", "spindle_background_task_progress_ratio"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(m.taskErrors); n != 1 {
		t.Fatalf("background_task_scrape_errors_total = %v after one failed scrape, want 1", n)
	}
}

// A node plugin (no task function) reports no background-task series.
func TestNoBackgroundTasksOnANode(t *testing.T) {
	m := New()
	if n, err := testutil.GatherAndCount(m.Registry, "spindle_background_tasks", "spindle_background_task_progress_ratio"); err != nil || n != 0 {
		t.Fatalf("a registry without a task function has %d task series (%v)", n, err)
	}
}
