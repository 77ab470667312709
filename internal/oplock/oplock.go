// Package oplock allows one operation per key at a time: a volume, a name
// being created, a volume on a node. A second caller does not wait: it
// gets ErrBusy (ABORTED) at once, which is what the CSI sidecars and
// kubelet expect and retry with backoff, rather than piling up goroutines
// behind a slow mkfs. One Locks serves a whole process, so that the
// controller side and the node side share it.
package oplock

import (
	"sync"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Locks are the operations in progress, by key.
type Locks struct {
	mu   sync.Mutex
	held map[string]struct{}
}

// New returns a set of locks none of which is held.
func New() *Locks {
	return &Locks{held: map[string]struct{}{}}
}

// Acquire takes key, or returns an ErrBusy error naming what holds it
// (what describes the key for that message: "volume loop/default/pvc-1").
// release frees the key; calling it again does nothing.
func (l *Locks) Acquire(key, what string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, busy := l.held[key]; busy {
		return nil, errdefs.Busy("an operation on %s is already in progress", what)
	}
	l.held[key] = struct{}{}
	// Once: a second release must not free the key for somebody else's operation.
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			delete(l.held, key)
			l.mu.Unlock()
		})
	}, nil
}

// Held reports whether key is held, for tests that wait for an operation
// to get past its lock.
func (l *Locks) Held(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.held[key]
	return ok
}

// Count is how many keys are held.
func (l *Locks) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}
