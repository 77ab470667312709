package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A records writer whose stop file exists before it starts writes nothing.
func TestRecordsStopFileBeforeStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "records")
	if _, err := run([]string{"stop-records", path}); err != nil {
		t.Fatal(err)
	}
	got, err := writeRecords(path, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if got != "records 0 errors 0 maxgap 0ms" {
		t.Errorf("writeRecords = %q, want no record", got)
	}
	if data, err := os.ReadFile(path); err != nil || len(data) != 0 {
		t.Errorf("%s holds %q (%v), want nothing", path, data, err)
	}
}

// A running writer stops at the next record once stop-records made its
// file; every record it acknowledged reads back in order.
func TestRecordsStopWhileWriting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "records")
	type result struct {
		msg string
		err error
	}
	done := make(chan result, 1)
	go func() {
		msg, err := writeRecords(path, time.Hour)
		done <- result{msg, err}
	}()
	for {
		if st, err := os.Stat(path); err == nil && st.Size() >= int64(3*len(record(1))) {
			break
		}
		time.Sleep(recordEvery)
	}
	if _, err := run([]string{"stop-records", path}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	var n, errs, gap int
	if _, err := fmt.Sscanf(r.msg, "records %d errors %d maxgap %dms", &n, &errs, &gap); err != nil || n < 3 || errs != 0 {
		t.Fatalf("writeRecords = %q (%v), want at least 3 records and no error", r.msg, err)
	}
	if got, err := verifyRecords(path, n); err != nil || got != fmt.Sprintf("verified %d records", n) {
		t.Errorf("verifyRecords(%d) = %q, %v", n, got, err)
	}
	if _, err := verifyRecords(path, n+1); err == nil {
		t.Errorf("verifyRecords(%d) passed, but the writer acknowledged %d", n+1, n)
	}
}
