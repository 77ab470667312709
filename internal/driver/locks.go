package driver

import (
	"sync"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// operationLocks allows one operation per key at a time. A second caller
// does not wait: it gets ABORTED at once, which is what the CSI sidecars
// expect and retry with backoff, rather than piling up goroutines behind a
// slow mkfs.
type operationLocks struct {
	mu   sync.Mutex
	held map[string]struct{}
}

func newOperationLocks() *operationLocks {
	return &operationLocks{held: map[string]struct{}{}}
}

// acquire takes key or returns an ErrBusy error naming what holds it.
func (l *operationLocks) acquire(key, what string) (release func(), err error) {
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

// lockVolume returns the backend instance serving id with the operation lock
// of scope held ("node" for node-side operations, "volume" for controller
// ones on the image), so that a second call on the same volume is ABORTED.
// The instance is looked up first: an unconfigured backend is refused
// before anything is locked.
func (d *Driver) lockVolume(scope string, id volumeid.ID) (*backend.Instance, func(), error) {
	inst, err := d.instanceFor(id)
	if err != nil {
		return nil, nil, err
	}
	release, err := d.locks.acquire(scope+"/"+id.String(), "volume "+id.String())
	if err != nil {
		return nil, nil, err
	}
	return inst, release, nil
}
