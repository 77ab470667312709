//go:build cgo && ceph

// Package rbd drives an RBD volume the way a database pod sees it when it
// moves between nodes, over the real path: a real Ceph cluster, rbd-fuse +
// loop devices (or the mounter rbdtest.EnvMounter selects), ext4, two
// driver instances with two node IDs on this host.
package rbd

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
	"github.com/spindle-csi/spindle/internal/backend/rbd/rbdtest"
)

func TestMain(m *testing.M) { os.Exit(rbdtest.Main(m)) }

const records = 300

// writeRecords appends n records, each "seq|payload|sha256(seq|payload)",
// with an fsync after every one, as a database commits.
func writeRecords(path string, n int) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	for i := range n {
		body := fmt.Sprintf("%d|%s", i, strings.Repeat(strconv.Itoa(i%10), 200))
		sum := sha256.Sum256([]byte(body))
		if _, err := fmt.Fprintf(f, "%s|%s\n", body, hex.EncodeToString(sum[:])); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
	}
	return f.Close()
}

// checkRecords reads every record back and checks sequence and checksums.
func checkRecords(path string, n int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	i := 0
	for sc.Scan() {
		line := sc.Text()
		cut := strings.LastIndexByte(line, '|')
		if cut < 0 {
			return fmt.Errorf("record %d is torn: %q", i, line)
		}
		body, sum := line[:cut], line[cut+1:]
		want := sha256.Sum256([]byte(body))
		if sum != hex.EncodeToString(want[:]) {
			return fmt.Errorf("record %d: checksum mismatch", i)
		}
		if !strings.HasPrefix(body, strconv.Itoa(i)+"|") {
			return fmt.Errorf("record %d: out of sequence: %.20q", i, body)
		}
		i++
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if i != n {
		return fmt.Errorf("%d records, want %d", i, n)
	}
	return nil
}

func TestDatabaseMovesBetweenNodes(t *testing.T) {
	cl := rbdtest.Require(t)
	t.Cleanup(func() {
		if err := cl.Wipe(context.Background()); err != nil {
			t.Errorf("empty the pool: %v", err)
		}
	})
	ctx := context.Background()
	cfg := func() string { return cl.DriverConfig(filepath.Join(harness.TempDir(t), "fuse")) }
	drvA := harness.Start(t, harness.Options{Config: cfg(), NodeID: "node-a"})
	drvB := harness.Start(t, harness.Options{Config: cfg(), NodeID: "node-b"})

	timings := map[string][]time.Duration{}
	var order []string
	observe := func(step, _ string, elapsed time.Duration, _ error) {
		if _, ok := timings[step]; !ok {
			order = append(order, step)
		}
		timings[step] = append(timings[step], elapsed)
	}
	a := &lifecycle.Client{Driver: drvA, NodeID: "node-a", Observe: observe}
	b := &lifecycle.Client{Driver: drvB, NodeID: "node-b", Observe: observe}
	dir := harness.TempDir(t)
	harness.CheckNoLeaks(t, dir, dir)

	v, err := a.Create(ctx, "pvc-database", 256<<20, lifecycle.MountCapability("ext4"), map[string]string{"backend": "rbd/ceph-test"}, filepath.Join(dir, "staging-a"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Delete(ctx, v) })
	targetA := filepath.Join(dir, "pod-a")
	for _, step := range []func() error{
		func() error { return a.ControllerPublish(ctx, v) },
		func() error { return a.Stage(ctx, v) },
		func() error { return a.Publish(ctx, v, targetA, false) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	if err := writeRecords(filepath.Join(targetA, "wal"), records); err != nil {
		t.Fatalf("workload on node A: %v", err)
	}
	workload := time.Since(t0)

	// Node B may not have it while node A does.
	vB := *v
	vB.StagingPath = filepath.Join(dir, "staging-b")
	err = b.ControllerPublish(ctx, &vB)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "node-a") {
		t.Fatalf("publish to node B while node A holds the volume = %v; want FailedPrecondition naming node-a", err)
	}

	for _, step := range []func() error{
		func() error { return a.Unpublish(ctx, v, targetA) },
		func() error { return a.Unstage(ctx, v) },
		func() error { return a.ControllerUnpublish(ctx, v) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	targetB := filepath.Join(dir, "pod-b")
	for _, step := range []func() error{
		func() error { return b.ControllerPublish(ctx, &vB) },
		func() error { return b.Stage(ctx, &vB) },
		func() error { return b.Publish(ctx, &vB, targetB, false) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if err := checkRecords(filepath.Join(targetB, "wal"), records); err != nil {
		t.Fatalf("records on node B: %v", err)
	}
	for _, step := range []func() error{
		func() error { return b.Unpublish(ctx, &vB, targetB) },
		func() error { return b.Unstage(ctx, &vB) },
		func() error { return b.ControllerUnpublish(ctx, &vB) },
		func() error { return a.Delete(ctx, v) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}

	var report strings.Builder
	fmt.Fprintf(&report, "rbd lifecycle (%s, ext4, 256 MiB, node A -> node B): Ceph start-up %s; %d fsynced records in %s (%.1f ms/record)\n",
		cl.Mounter, cl.StartUp.Round(time.Millisecond), records, workload.Round(time.Millisecond), float64(workload.Microseconds())/1000/records)
	for _, step := range order {
		var parts []string
		for _, d := range timings[step] {
			parts = append(parts, d.Round(time.Millisecond).String())
		}
		fmt.Fprintf(&report, "  %-26s %s\n", step, strings.Join(parts, ", "))
	}
	t.Log("\n" + report.String())
	if rd := os.Getenv("SPINDLE_REPORT_DIR"); rd != "" {
		_ = os.MkdirAll(rd, 0o755)
		_ = os.WriteFile(filepath.Join(rd, "rbd-lifecycle.txt"), []byte(report.String()), 0o644)
	}
}
