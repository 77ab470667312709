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

// TestDeadlineSaysWhose: a call stopped by the driver's own per-call
// limit says so and carries no error kind (the driver answers
// DEADLINE_EXCEEDED); one stopped by the caller's deadline says that; a
// cluster that answers with an error is classified by its exit status.
// "rbd" is a script that hangs, or fails as rbd does for a missing image.
func TestDeadlineSaysWhose(t *testing.T) {
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
	c := &cluster{cfg: cfg, run: command.New(utilexec.New(), nil), callLimit: 300 * time.Millisecond}

	_, err := c.on("c").rbd(context.Background(), "hang")
	if err == nil || errdefs.KindOf(err) != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call past the per-call limit = %v (kind %v); want a kindless deadline error", err, errdefs.KindOf(err))
	}
	if msg := err.Error(); !strings.Contains(msg, "Spindle's own per-call limit of 300ms") || !strings.Contains(msg, "not refused by the cluster") || strings.Contains(msg, "did not answer") {
		t.Fatalf("a call past the per-call limit says %q; want it to name the driver's own limit", msg)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = c.on("c").rbd(ctx, "hang")
	if err == nil || errdefs.KindOf(err) != nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "the request's own deadline") {
		t.Fatalf("a call past the caller's deadline = %v; want the request's deadline named", err)
	}

	_, err = c.on("c").rbd(context.Background(), "missing")
	if errdefs.KindOf(err) != errdefs.ErrNotFound {
		t.Fatalf("rbd exiting 2 = %v; want ErrNotFound", err)
	}
}
