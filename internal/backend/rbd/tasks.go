package rbd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/ceph"
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

// background tracks the tasks this process runs itself.
type background struct {
	mu sync.Mutex
	// noMgr: the cluster answered that it has no rbd task commands; set
	// once, for the life of the process.
	noMgr bool
	// local are the tasks this process runs, by action and image.
	local map[string]*backend.Task
	// running counts the goroutines of afterAnswer.
	running sync.WaitGroup
	// opening holds, by image (ref.spec()), the afterAnswer work that
	// opens it. An open image has a watcher, which Delete would take for
	// a node's mapping, so Delete waits for that work first.
	opening map[string]*openers
}

// openers counts the afterAnswer work that has one image open; done is
// closed when the last ends.
type openers struct {
	n    int
	done chan struct{}
}

func (b *background) begin(image string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.opening == nil {
		b.opening = map[string]*openers{}
	}
	o := b.opening[image]
	if o == nil {
		o = &openers{done: make(chan struct{})}
		b.opening[image] = o
	}
	o.n++
}

func (b *background) end(image string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	o := b.opening[image]
	if o.n--; o.n == 0 {
		close(o.done)
		delete(b.opening, image)
	}
}

// settled waits until no afterAnswer work has the image open.
func (b *background) settled(ctx context.Context, image string) error {
	b.mu.Lock()
	o := b.opening[image]
	b.mu.Unlock()
	if o == nil {
		return nil
	}
	select {
	case <-o.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for this driver's own work on image %s to end: %w", image, ctx.Err())
	}
}

// afterAnswer runs work in a goroutine of its own, so that the RPC
// answers before it: cluster calls whose wait no answer depends on, such
// as removing an RBD snapshot (a commit of the OSD map, up to a second).
// It keeps the context's values (the request's cephx credentials), not
// its deadline or cancellation; each call is still bounded by the call
// limit. What it fails to do is found undone by Sweep, which has the
// last word on leftovers.
//
// opens names the image the work opens (ref.spec()), "" for none: a
// Delete of that image waits for the work (background.settled).
func (s *Store) afterAnswer(ctx context.Context, opens string, work func(context.Context)) {
	s.bg.running.Add(1)
	if opens != "" {
		s.bg.begin(opens)
	}
	bg := context.WithoutCancel(ctx)
	go func() {
		defer s.bg.running.Done()
		if opens != "" {
			defer s.bg.end(opens)
		}
		work(bg)
	}()
}

func (b *background) mgrMissing() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.noMgr
}

// flattenInBackground has the image flattened outside any RPC. A flatten
// of the image that is already queued is not queued twice (the mgr
// answers with the existing task; this process keys its own by image).
func (s *Store) flattenInBackground(ctx context.Context, r ref) error {
	return s.inBackground(ctx, r.location, backend.TaskFlatten, s.idOf(r), "flatten "+r.spec(),
		func(cl ceph.Client) error { return cl.AddFlattenTask(ctx, r.cephImage()) },
		func(cl ceph.Client, ctx context.Context) error { return cl.FlattenImage(ctx, r.cephImage()) })
}

// removeInBackground has the trashed image id of a location removed for
// good.
func (s *Store) removeInBackground(ctx context.Context, l location, id, name string) error {
	return s.inBackground(ctx, l, backend.TaskRemove, s.idOf(l.ref(name)), "trash remove "+l.ref(id).spec(),
		func(cl ceph.Client) error { return cl.AddTrashRemoveTask(ctx, l.cephPool(), id) },
		func(cl ceph.Client, ctx context.Context) error { return cl.TrashRemove(ctx, l.cephPool(), id) })
}

// inBackground hands the work to the manager (toManager), or, where it
// has no rbd_support module, runs it in this process (here).
func (s *Store) inBackground(ctx context.Context, l location, action, image, what string, toManager func(ceph.Client) error, here func(ceph.Client, context.Context) error) error {
	if !s.bg.mgrMissing() {
		cl, err := s.client(ctx, l)
		if err != nil {
			return err
		}
		err = toManager(cl)
		if !errors.Is(err, ceph.ErrTasksUnsupported) {
			return err
		}
		s.bg.mu.Lock()
		s.bg.noMgr = true
		s.bg.mu.Unlock()
	}
	s.runLocally(ctx, l, action, image, what, here)
	return nil
}

// runLocally runs the work in a goroutine of its own, once per action and
// image at a time. It keeps the context's values (the request's cephx
// credentials) but not its deadline or cancellation, and calls the
// cluster under backgroundCallTimeout.
func (s *Store) runLocally(ctx context.Context, l location, action, image, what string, work func(ceph.Client, context.Context) error) {
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
		Message: what, Since: s.clock().UTC().Truncate(time.Second)}
	bg := context.WithoutCancel(ctx)
	go func() {
		cl, err := s.c.backgroundClient(bg, l.cluster)
		if err == nil {
			err = work(cl, bg)
		}
		s.bg.mu.Lock()
		defer s.bg.mu.Unlock()
		if err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
			// The failure stays visible until Maintain starts the task
			// again, finding the work still undone.
			t := s.bg.local[key]
			t.InProgress, t.Message = false, fmt.Sprintf("%s failed: %v", what, err)
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
		cl, err := s.client(ctx, s.ownLocation())
		if err != nil {
			return nil, err
		}
		list, err := cl.Tasks(ctx)
		if err != nil && !errors.Is(err, ceph.ErrTasksUnsupported) {
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
func (s *Store) taskOf(t ceph.Task, locs []location) (backend.Task, bool) {
	i := slices.IndexFunc(locs, func(l location) bool { return l.cephPool() == t.Pool })
	if i < 0 {
		return backend.Task{}, false
	}
	l := locs[i]
	task := backend.Task{Progress: t.Progress, InProgress: t.InProgress, Runner: runnerMgr, Message: t.Message}
	if t.RetryMessage != "" {
		task.Message += " (retrying: " + t.RetryMessage + ")"
	}
	switch t.Action {
	case ceph.TaskFlatten:
		if !isSpindleImage(t.Image) {
			return backend.Task{}, false
		}
		task.Action, task.Image = backend.TaskFlatten, s.idOf(l.ref(t.Image))
	case ceph.TaskTrashRemove:
		// The mgr names a trashed image by its ID only.
		task.Action, task.Image = backend.TaskRemove, s.idOf(l.ref(t.ImageID))+" (trash)"
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
