package rbd

import (
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
)

// SetClock makes the instance's store judge ages (Sweep) by now.
func SetClock(inst *backend.Instance, now func() time.Time) { inst.Store.(*Store).now = now }
