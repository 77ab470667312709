package backend

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

func TestMemoized(t *testing.T) {
	errList := errors.New("rbd device list: timed out")
	for _, tc := range []struct {
		name      string
		memo      bool
		err       error
		keys      []string
		wantCalls int32
	}{
		{"without a memo every call lists", false, nil, []string{"a", "a", "a"}, 3},
		{"under a memo once per key", true, nil, []string{"a", "a", "b", "a", "b"}, 2},
		{"an error is the answer too", true, errList, []string{"a", "a"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.memo {
				ctx = WithListingMemo(ctx)
			}
			var calls atomic.Int32
			for _, k := range tc.keys {
				got, err := Memoized(ctx, k, func() ([]string, error) {
					calls.Add(1)
					if tc.err != nil {
						return nil, tc.err
					}
					return []string{"/dev/nbd0", k}, nil
				})
				if !errors.Is(err, tc.err) {
					t.Fatalf("key %s: error %v, want %v", k, err, tc.err)
				}
				if tc.err == nil && (len(got) != 2 || got[1] != k) {
					t.Fatalf("key %s: got %v, want the listing made for %s", k, got, k)
				}
			}
			if n := calls.Load(); n != tc.wantCalls {
				t.Errorf("listed %d times, want %d", n, tc.wantCalls)
			}
		})
	}
}

// Concurrent callers of one key under one memo share one listing.
func TestMemoizedConcurrent(t *testing.T) {
	ctx := WithListingMemo(context.Background())
	var calls atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = Memoized(ctx, "nbd", func() (int, error) { return int(calls.Add(1)), nil })
		}()
	}
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Errorf("listed %d times, want 1", n)
	}
}
