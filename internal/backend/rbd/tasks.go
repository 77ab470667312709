package rbd

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Background work. Flattening a clone and removing an image take time in
// proportion to the data, so no RPC waits for them: they are handed to the
// Ceph manager's rbd_support module ("ceph rbd task add flatten|trash
// remove"), which runs them in the cluster, keeps them across restarts of
// the driver and of the mgr, retries them and reports their progress
// ("ceph rbd task list"). Where the cluster has no such module (its mgr
// says so), this process runs the same command itself, outside any RPC and
// without the per-call deadline; Maintain starts it again after a
// controller restart, since it finds the work still undone.

// Runners of background tasks (backend.Task.Runner).
const (
	runnerMgr    = "ceph-mgr"
	runnerDriver = "driver"
)

// mgrTask is one entry of "ceph rbd task list --format json" and the answer
// of "ceph rbd task add".
type mgrTask struct {
	Sequence int    `json:"sequence"`
	ID       string `json:"id"`
	Message  string `json:"message"`
	Refs     struct {
		Action        string `json:"action"`
		PoolName      string `json:"pool_name"`
		PoolNamespace string `json:"pool_namespace"`
		ImageName     string `json:"image_name"`
		ImageID       string `json:"image_id"`
	} `json:"refs"`
	InProgress   bool     `json:"in_progress"`
	Progress     *float64 `json:"progress,omitempty"`
	RetryMessage string   `json:"retry_message,omitempty"`
}

// The mgr's names of the task actions Spindle adds.
const (
	mgrFlatten     = "flatten"
	mgrTrashRemove = "trash remove"
)

// background tracks the tasks this process runs itself.
type background struct {
	mu sync.Mutex
	// noMgr: the cluster answered that it has no rbd task commands; set
	// once, for the life of the process.
	noMgr bool
	// local are the tasks this process runs, by action and image.
	local map[string]*backend.Task
}

func (b *background) mgrMissing() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.noMgr
}

// mgrTasksMissing reports whether a "ceph rbd task" call failed because the
// cluster has no such command: a mgr without rbd_support (before Ceph
// 14.2.3, or the module disabled). EINVAL with "no valid command found" or
// "No handler", or EOPNOTSUPP for a disabled module.
func mgrTasksMissing(err error) bool {
	stderr := command.Stderr(err)
	switch command.ExitCode(err) {
	case exitEINVAL:
		return strings.Contains(stderr, "no valid command found") || strings.Contains(stderr, "No handler")
	case exitEOPNOTSUPP:
		return true
	}
	return false
}

// flattenInBackground has the image flattened outside any RPC. A flatten
// of the image that is already queued is not queued twice (the mgr
// answers with the existing task; this process keys its own by image).
func (s *Store) flattenInBackground(ctx context.Context, r ref) error {
	return s.inBackground(ctx, s.on(r.location), backend.TaskFlatten, s.idOf(r),
		[]string{"rbd", "task", "add", "flatten", r.spec()},
		[]string{"flatten", "--no-progress", r.spec()})
}

// removeInBackground has the trashed image id of a location removed for
// good.
func (s *Store) removeInBackground(ctx context.Context, l location, id, name string) error {
	return s.inBackground(ctx, s.on(l), backend.TaskRemove, s.idOf(l.ref(name)),
		[]string{"rbd", "task", "add", "trash", "remove", l.ref(id).spec()},
		[]string{"trash", "rm", "--no-progress", l.ref(id).spec()})
}

func (s *Store) inBackground(ctx context.Context, k conn, action, image string, mgrArgs, localArgs []string) error {
	if !s.bg.mgrMissing() {
		_, err := k.ceph(ctx, append(mgrArgs, "--format", "json")...)
		if err == nil || !mgrTasksMissing(err) {
			return err
		}
		s.bg.mu.Lock()
		s.bg.noMgr = true
		s.bg.mu.Unlock()
	}
	s.runLocally(ctx, k, action, image, localArgs)
	return nil
}

// runLocally runs "rbd args" in a goroutine of its own, once per action
// and image at a time. It keeps the context's values (the request's cephx
// credentials) but not its deadline or cancellation.
func (s *Store) runLocally(ctx context.Context, k conn, action, image string, args []string) {
	key := action + " " + image
	s.bg.mu.Lock()
	defer s.bg.mu.Unlock()
	if s.bg.local == nil {
		s.bg.local = map[string]*backend.Task{}
	}
	if t, ok := s.bg.local[key]; ok && t.InProgress {
		return
	}
	s.bg.local[key] = &backend.Task{Action: action, Image: image, Progress: -1, InProgress: true, Runner: runnerDriver,
		Message: "rbd " + strings.Join(args, " "), Since: s.clock().UTC().Truncate(time.Second)}
	go func() {
		_, err := k.rbdBackground(context.WithoutCancel(ctx), args...)
		s.bg.mu.Lock()
		defer s.bg.mu.Unlock()
		if err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
			// The failure stays visible until Maintain starts the task
			// again, finding the work still undone.
			t := s.bg.local[key]
			t.InProgress, t.Message = false, fmt.Sprintf("rbd %s failed: %v", strings.Join(args, " "), err)
			return
		}
		delete(s.bg.local, key)
	}()
}

// Tasks implements backend.TaskReporter: the mgr's tasks on the Spindle
// images of the instance's own cluster, and those this process runs.
func (s *Store) Tasks(ctx context.Context) ([]backend.Task, error) {
	var out []backend.Task
	if !s.bg.mgrMissing() {
		locs, err := s.maintainedLocations(ctx)
		if err != nil {
			return nil, err
		}
		var list []mgrTask
		raw, err := s.on(s.ownLocation()).ceph(ctx, "rbd", "task", "list", "--format", "json")
		switch {
		case err == nil:
			if err := json.Unmarshal(raw, &list); err != nil {
				return nil, fmt.Errorf("ceph rbd task list: cannot parse its JSON output %.200q: %w", raw, err)
			}
		case mgrTasksMissing(err):
		default:
			return nil, err
		}
		for _, t := range list {
			if task, ok := s.taskOf(t, locs); ok {
				out = append(out, task)
			}
		}
	}
	s.bg.mu.Lock()
	for _, t := range s.bg.local {
		out = append(out, *t)
	}
	s.bg.mu.Unlock()
	slices.SortFunc(out, func(a, b backend.Task) int {
		return strings.Compare(a.Image+" "+a.Action, b.Image+" "+b.Action)
	})
	return out, nil
}

// taskOf translates one mgr task, if it is on an image in one of locs.
func (s *Store) taskOf(t mgrTask, locs []location) (backend.Task, bool) {
	i := slices.IndexFunc(locs, func(l location) bool { return l.pool == t.Refs.PoolName && l.namespace == t.Refs.PoolNamespace })
	if i < 0 {
		return backend.Task{}, false
	}
	l := locs[i]
	task := backend.Task{Progress: -1, InProgress: t.InProgress, Runner: runnerMgr, Message: t.Message}
	if t.Progress != nil {
		task.Progress = *t.Progress
	}
	if t.RetryMessage != "" {
		task.Message += " (retrying: " + t.RetryMessage + ")"
	}
	switch t.Refs.Action {
	case mgrFlatten:
		if !isSpindleImage(t.Refs.ImageName) {
			return backend.Task{}, false
		}
		task.Action, task.Image = backend.TaskFlatten, s.idOf(l.ref(t.Refs.ImageName))
	case mgrTrashRemove:
		// The mgr names a trashed image by its ID only.
		task.Action, task.Image = backend.TaskRemove, s.idOf(l.ref(t.Refs.ImageID))+" (trash)"
	default:
		return backend.Task{}, false
	}
	return task, true
}

// isSpindleImage reports whether an image name is one Spindle gives.
func isSpindleImage(name string) bool {
	return strings.HasPrefix(name, volumePrefix) || strings.HasPrefix(name, snapPrefix) || strings.HasPrefix(name, tmpPrefix)
}

var _ backend.TaskReporter = (*Store)(nil)
