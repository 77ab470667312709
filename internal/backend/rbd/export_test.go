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

// KernelTakesAES256K says whether krbd's stage check holds a kernel
// release able to use aes256k keys.
func KernelTakesAES256K(release string) bool {
	major, minor, ok := kernelVersion(release)
	return ok && (major > kernelCipherSince[0] || major == kernelCipherSince[0] && minor >= kernelCipherSince[1])
}
