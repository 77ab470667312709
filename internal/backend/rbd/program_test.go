package rbd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// TestProgramDeadlineSaysWhose: a node program (rbd device map, rbd-nbd)
// stopped by the driver's own per-call limit says so and carries no error
// kind (the driver answers DEADLINE_EXCEEDED); one stopped by the caller's
// deadline says that; one that fails is classified by its exit status.
// "rbd" is a script that hangs, or fails as rbd does for a missing image.
func TestProgramDeadlineSaysWhose(t *testing.T) {
	bin := t.TempDir()
	script := `#!/bin/sh
case "$1" in
hang) exec sleep 60 ;;
missing) echo "rbd: error opening image x: (2) No such file or directory" >&2; exit 2 ;;
esac
`
	if err := os.WriteFile(filepath.Join(bin, "rbd"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	cfg := Config{ClusterID: "c", Monitors: []string{"10.0.0.1:3300"}, Pool: "kube", UserID: "csi", KeyFile: "/etc/spindle/ceph.key"}.withDefaults()
	c := &cluster{cfg: cfg, run: command.New(utilexec.New(), nil), programLimit: 300 * time.Millisecond}

	_, err := c.program(context.Background(), c.run, "c", "rbd", "hang")
	if err == nil || errdefs.KindOf(err) != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call past the per-call limit = %v (kind %v); want a kindless deadline error", err, errdefs.KindOf(err))
	}
	if msg := err.Error(); !strings.Contains(msg, "Spindle's own per-call limit of 300ms") || !strings.Contains(msg, "not refused by the cluster") || strings.Contains(msg, "did not answer") {
		t.Fatalf("a call past the per-call limit says %q; want it to name the driver's own limit", msg)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = c.program(ctx, c.run, "c", "rbd", "hang")
	if err == nil || errdefs.KindOf(err) != nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "the request's own deadline") {
		t.Fatalf("a call past the caller's deadline = %v; want the request's deadline named", err)
	}

	_, err = c.program(context.Background(), c.run, "c", "rbd", "missing")
	if errdefs.KindOf(err) != errdefs.ErrNotFound {
		t.Fatalf("rbd exiting 2 = %v; want ErrNotFound", err)
	}
}

// TestClientSlotsBoundConcurrentCalls: with maxConcurrentCalls 2, five
// node programs at once never run more than two Ceph clients together,
// and all five complete; a call that finds every slot taken waits, and when its
// request's deadline passes first it fails naming the slots and the
// deadline, without ever having started a client. "rbd" is a script that
// records how many clients run as it starts, then waits for a go file.
func TestClientSlotsBoundConcurrentCalls(t *testing.T) {
	bin, state := t.TempDir(), t.TempDir()
	script := `#!/bin/sh
touch "` + state + `/running.$$"
ls "` + state + `" | grep -c '^running\.' >> "` + state + `/starts"
while [ ! -e "` + state + `/go" ]; do sleep 0.02; done
rm -f "` + state + `/running.$$"
`
	if err := os.WriteFile(filepath.Join(bin, "rbd"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	cfg := Config{ClusterID: "c", Monitors: []string{"10.0.0.1:3300"}, Pool: "kube", UserID: "csi", KeyFile: "/etc/spindle/ceph.key", MaxConcurrentCalls: 2}.withDefaults()
	c := newCluster(cfg, command.New(utilexec.New(), nil), nil)
	goFile := filepath.Join(state, "go")
	starts := func() []string {
		b, _ := os.ReadFile(filepath.Join(state, "starts"))
		return strings.Fields(string(b))
	}
	waitStarts := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); len(starts()) < n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d clients started; want %d", len(starts()), n)
			}
		}
	}

	errs := make(chan error, 5)
	for range 5 {
		go func() {
			_, err := c.program(context.Background(), c.run, "c", "rbd", "info", "x")
			errs <- err
		}()
	}
	waitStarts(2)
	// The other three are waiting for a slot; let every client finish.
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := <-errs; err != nil {
			t.Fatalf("a call through the slots = %v", err)
		}
	}
	got := starts()
	if len(got) != 5 {
		t.Fatalf("%d clients ran for 5 calls (%v)", len(got), got)
	}
	for _, n := range got {
		if n != "1" && n != "2" {
			t.Fatalf("a client started while %s ran (counts at each start: %v); want at most 2", n, got)
		}
	}

	// Both slots held by clients that wait; a third call's deadline passes.
	if err := os.Remove(goFile); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		go func() {
			_, err := c.program(context.Background(), c.run, "c", "rbd", "info", "x")
			errs <- err
		}()
	}
	waitStarts(7)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := c.program(ctx, c.run, "c", "rbd", "info", "y")
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "2 Ceph client slots") {
		t.Fatalf("a call finding every slot taken past its deadline = %v; want the request's deadline and the slots named", err)
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := len(starts()); n != 7 {
		t.Fatalf("%d clients ran; the call that never got a slot started one", n)
	}
}
