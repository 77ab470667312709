package driver

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/metrics"
	"github.com/spindle-csi/spindle/internal/opsapi"
)

// Backends hand long work (flattening a copy-on-write clone, removing a
// large image) to background tasks and answer at once; a controller keeps
// them going: every backend.MaintainInterval it lets each instance that
// has upkeep (backend.Maintainer) redo what a restart dropped and remove
// what waited for something else to go first, and it shows the tasks
// (backend.TaskReporter) in its metrics and its /images document.

// maintainTimeout bounds one instance's round of upkeep: each call in it
// has its own deadline; this only keeps a stuck round from holding up the
// next.
const maintainTimeout = 5 * time.Minute

// taskListTimeout bounds listing an instance's tasks for a scrape or for
// /images.
const taskListTimeout = 10 * time.Second

// maintain runs the upkeep of every instance until ctx ends.
func (d *Driver) maintain(ctx context.Context) {
	tick := time.NewTicker(backend.MaintainInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, key := range d.instanceKeys() {
			m, ok := d.instances[key].Store.(backend.Maintainer)
			if !ok {
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, maintainTimeout)
			changed, err := m.Maintain(rctx)
			cancel()
			for _, c := range changed {
				d.log.Info("backend upkeep", zap.String("backend", key), zap.String("change", c))
			}
			if err != nil && ctx.Err() == nil {
				d.log.Warn("backend upkeep failed; retried in a minute", zap.String("backend", key), zap.Error(err))
			}
		}
	}
}

// instanceTasks lists one instance's background tasks; ok is false when it
// runs none.
func (d *Driver) instanceTasks(ctx context.Context, key string) (tasks []backend.Task, ok bool, err error) {
	r, ok := d.instances[key].Store.(backend.TaskReporter)
	if !ok {
		return nil, false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, taskListTimeout)
	defer cancel()
	tasks, err = r.Tasks(ctx)
	return tasks, true, err
}

// backgroundTasks is what the background-task gauges show.
func (d *Driver) backgroundTasks() ([]metrics.BackgroundTask, error) {
	var out []metrics.BackgroundTask
	var firstErr error
	for _, key := range d.instanceKeys() {
		tasks, _, err := d.instanceTasks(context.Background(), key)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		for _, t := range tasks {
			out = append(out, metrics.BackgroundTask{Backend: key, Action: t.Action, Image: t.Image, Progress: t.Progress, InProgress: t.InProgress})
		}
	}
	return out, firstErr
}

// addTasks puts an instance's tasks into its part of the /images document:
// all of them, and each volume's with the volume.
func (d *Driver) addTasks(ctx context.Context, b *opsapi.BackendImages) {
	tasks, ok, err := d.instanceTasks(ctx, b.Backend)
	if !ok {
		return
	}
	if err != nil {
		b.TasksError = err.Error()
	}
	byImage := map[string][]opsapi.Task{}
	for _, t := range tasks {
		o := opsapi.Task{Action: t.Action, Image: t.Image, Progress: t.Progress, InProgress: t.InProgress, Runner: t.Runner, Message: t.Message, Since: t.Since}
		b.Tasks = append(b.Tasks, o)
		byImage[t.Image] = append(byImage[t.Image], o)
	}
	for i := range b.Images {
		b.Images[i].Tasks = byImage[b.Images[i].Image]
	}
}
