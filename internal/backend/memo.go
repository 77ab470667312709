package backend

import (
	"context"
	"sync"
)

// listingMemo holds the listings already made under one context.
type listingMemo struct {
	mu      sync.Mutex
	entries map[any]*memoEntry
}

type memoEntry struct {
	once  sync.Once
	value any
	err   error
}

type listingMemoKey struct{}

// WithListingMemo returns a context under which Memoized runs each listing
// once and shares its answer: for a read-only look at many volumes (the
// node's inventory), whose per-volume checks would each list the same
// devices again (rbd-nbd's list starts a Ceph client: seconds on a slow
// node, for every volume). Stage, unstage and the other RPCs never use it:
// they act on what is true at that moment.
func WithListingMemo(ctx context.Context) context.Context {
	return context.WithValue(ctx, listingMemoKey{}, &listingMemo{entries: map[any]*memoEntry{}})
}

// Memoized returns list's answer: made once per key (a comparable value
// naming the listing and who lists) under a context of WithListingMemo,
// an error included; made every time under any other context.
func Memoized[T any](ctx context.Context, key any, list func() (T, error)) (T, error) {
	m, ok := ctx.Value(listingMemoKey{}).(*listingMemo)
	if !ok {
		return list()
	}
	m.mu.Lock()
	e := m.entries[key]
	if e == nil {
		e = &memoEntry{}
		m.entries[key] = e
	}
	m.mu.Unlock()
	e.once.Do(func() { e.value, e.err = list() })
	v, _ := e.value.(T)
	return v, e.err
}
