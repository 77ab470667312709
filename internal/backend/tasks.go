package backend

import (
	"context"
	"time"
)

// Work whose length grows with the data (flattening a copy-on-write clone,
// removing a large image) never runs inside an RPC: a store hands it to a
// background task and answers. These interfaces let the driver run a
// store's upkeep and show its tasks to operators.

// Task is one piece of background work of a store.
type Task struct {
	// Action is what the task does: TaskFlatten, TaskRemove.
	Action string `json:"action"`
	// Image is the store's name of the image it works on ("pool/csi-vol-…"
	// for RBD): the image part of a volume or snapshot ID when the image
	// still has one, the name it had otherwise.
	Image string `json:"image"`
	// Progress is the fraction done, 0 to 1; -1 when the worker does not
	// say.
	Progress float64 `json:"progress"`
	// InProgress: a worker is on it now (else it is queued or waits to be
	// retried).
	InProgress bool `json:"inProgress"`
	// Runner names who runs it: "ceph-mgr" (Ceph's rbd_support module, which
	// keeps it across restarts of the driver) or "driver" (this process,
	// redone by the next controller when it restarts).
	Runner string `json:"runner"`
	// Message is the runner's description, and its last error when it
	// retries.
	Message string `json:"message,omitempty"`
	// Since is when the task was queued, when the runner says.
	Since time.Time `json:"since,omitzero"`
}

// Task actions.
const (
	TaskFlatten = "flatten"
	TaskRemove  = "remove"
)

// TaskReporter is implemented by stores that run background tasks.
type TaskReporter interface {
	// Tasks lists the store's pending and running tasks, sorted by image
	// and action.
	Tasks(ctx context.Context) ([]Task, error)
}

// Maintainer is implemented by stores that have upkeep to do while a
// controller serves: restart the background work a crash dropped, remove
// what waited for something else to go first, sweep what an interrupted
// call left. A controller calls Maintain every MaintainInterval; it
// returns what it changed, for the log.
type Maintainer interface {
	Maintain(ctx context.Context) (changed []string, err error)
}

// MaintainInterval is how often a controller maintains each instance.
const MaintainInterval = time.Minute
