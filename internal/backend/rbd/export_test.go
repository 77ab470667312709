package rbd

import (
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
)

// SetClock makes the instance's store judge ages (Sweep) by now.
func SetClock(inst *backend.Instance, now func() time.Time) { inst.Store.(*Store).now = now }

// WaitAnswered waits for the work the store's RPCs left running after
// their answers (afterAnswer).
func WaitAnswered(store *Store) { store.bg.running.Wait() }
