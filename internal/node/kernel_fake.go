package node

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// FakeKernelMounts is an in-memory mount table for tests of the data path:
// it counts the mounts stacked at each path, answers unmount of a path with
// nothing mounted with EINVAL as the kernel does, and records every call.
type FakeKernelMounts struct {
	mu sync.Mutex
	// Stacked is the number of mounts at each path.
	Stacked map[string]int
	// StatfsFlags are the per-mount flags statfs reports (unix.ST_*).
	StatfsFlags int64
	// Fail makes the call whose record equals the key fail with the value.
	Fail map[string]error
	// Calls records "bind <source> <target>", "remount-ro <target> flags=<hex>"
	// and "unmount <target>", in order.
	Calls []string
}

var _ kernelMounts = (*FakeKernelMounts)(nil)

// NewFakeKernelMounts returns an empty table.
func NewFakeKernelMounts() *FakeKernelMounts {
	return &FakeKernelMounts{Stacked: map[string]int{}, Fail: map[string]error{}}
}

func (f *FakeKernelMounts) record(call string) error {
	f.Calls = append(f.Calls, call)
	return f.Fail[call]
}

func (f *FakeKernelMounts) Mount(source, target, _ string, flags uintptr, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if flags&unix.MS_REMOUNT != 0 {
		if err := f.record(fmt.Sprintf("remount-ro %s flags=%#x", target, flags)); err != nil {
			return err
		}
		if f.Stacked[target] == 0 {
			return unix.EINVAL
		}
		return nil
	}
	if err := f.record("bind " + source + " " + target); err != nil {
		return err
	}
	f.Stacked[target]++
	return nil
}

func (f *FakeKernelMounts) Unmount(target string, _ int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("unmount " + target); err != nil {
		return err
	}
	if f.Stacked[target] == 0 {
		return unix.EINVAL
	}
	f.Stacked[target]--
	return nil
}

func (f *FakeKernelMounts) Statfs(_ string, st *unix.Statfs_t) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	st.Flags = f.StatfsFlags
	return nil
}
