package oplock

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

func TestLocks(t *testing.T) {
	t.Parallel()
	l := New()
	release, err := l.Acquire("volume/loop/default/a", "volume loop/default/a")
	if err != nil {
		t.Fatalf("first acquire: %v", err)
	}
	if !l.Held("volume/loop/default/a") {
		t.Fatal("an acquired key is not held")
	}

	_, err = l.Acquire("volume/loop/default/a", "volume loop/default/a")
	if !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("second acquire: err = %v, want busy", err)
	}
	if !strings.Contains(err.Error(), "volume loop/default/a") || !strings.Contains(err.Error(), "already in progress") {
		t.Fatalf("busy error %q does not say what is busy", err)
	}

	other, err := l.Acquire("volume/loop/default/b", "volume loop/default/b")
	if err != nil {
		t.Fatalf("another key is independent: %v", err)
	}
	other()

	release()
	again, err := l.Acquire("volume/loop/default/a", "volume loop/default/a")
	if err != nil {
		t.Fatalf("acquire after release: %v", err)
	}
	again()
	if n := l.Count(); n != 0 {
		t.Fatalf("%d locks still held after every release", n)
	}
}

// Releasing twice must not free the key for an operation that took it in between.
func TestLocksDoubleRelease(t *testing.T) {
	t.Parallel()
	l := New()
	release, err := l.Acquire("k", "thing")
	if err != nil {
		t.Fatal(err)
	}
	release()
	second, err := l.Acquire("k", "thing")
	if err != nil {
		t.Fatal(err)
	}
	defer second()
	release() // a stray second call of the first release
	if _, err := l.Acquire("k", "thing"); err == nil {
		t.Fatal("a repeated release freed a lock held by another operation")
	}
}

// Of many callers racing for one key, exactly one gets it; the others are
// refused rather than queued.
func TestLocksConcurrent(t *testing.T) {
	t.Parallel()
	l := New()
	const callers = 32
	var (
		start    = make(chan struct{})
		wg       sync.WaitGroup
		mu       sync.Mutex
		winners  []func()
		refusals int
	)
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			release, err := l.Acquire("create/pvc-race", "volume name pvc-race")
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if errors.Is(err, errdefs.ErrBusy) {
					refusals++
				}
				return
			}
			winners = append(winners, release) // held until every caller has tried
		}()
	}
	close(start)
	wg.Wait()
	if len(winners) != 1 || refusals != callers-1 {
		t.Fatalf("%d callers got the lock and %d were refused; want 1 and %d", len(winners), refusals, callers-1)
	}
	winners[0]()
}
