package multinode

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The writer's log as spindle-e2e-pod prints it (run L's loop writer: a
// pause at its start, before the disruption, then the disruption's).
const writerLog = `record 1
gap 6919ms before record 15 at 15:12:09.832
record 50
record 100
gap 1185ms before record 227 at 15:12:49.884
record 200
gap 1498ms before record 248 at 15:12:58.606
record 250
gap 1264ms before record 1671 at 15:16:12.865
record 1700
`

func TestWriterLogParsing(t *testing.T) {
	if got := lastRecordLogged(writerLog); got != 1700 {
		t.Errorf("lastRecordLogged = %d, want 1700", got)
	}
	// As the log stood when run L's disruption began: the pause at the
	// writer's start is logged, so it is not the disruption's.
	if got := lastRecordLogged("record 1\ngap 6919ms before record 15 at 15:12:09.832\n"); got != 15 {
		t.Errorf("lastRecordLogged with a gap logged last = %d, want 15", got)
	}
	if got := lastRecordLogged("records 3 errors 0 maxgap 120ms\n"); got != 0 {
		t.Errorf("lastRecordLogged of a report line = %d, want 0", got)
	}
	for _, tc := range []struct {
		after int
		want  time.Duration
	}{
		{after: 0, want: 6919 * time.Millisecond},
		{after: 14, want: 6919 * time.Millisecond},
		{after: 15, want: 1498 * time.Millisecond},
		{after: 200, want: 1498 * time.Millisecond},
		{after: 250, want: 1264 * time.Millisecond},
		{after: 1700, want: 0},
	} {
		if got := longestGapAfter(writerLog, tc.after); got != tc.want {
			t.Errorf("longestGapAfter(after record %d) = %v, want %v", tc.after, got, tc.want)
		}
	}
}

// lastRecordLogged is the last record a writer's log names, in a "record
// N" line (every 50th) or a gap's line (0 when none): a gap logged before
// the disruption began is not the disruption's.
func lastRecordLogged(log string) int {
	last := 0
	for _, l := range strings.Split(log, "\n") {
		var n, ms int
		if _, err := fmt.Sscanf(l, "record %d", &n); err != nil {
			if _, err := fmt.Sscanf(l, "gap %dms before record %d", &ms, &n); err != nil {
				continue
			}
		}
		last = max(last, n)
	}
	return last
}

// longestGapAfter is the longest of the gaps a writer's log reports
// ("gap 1498ms before record 248 at 15:12:58.606") before a record after
// record after. The writer logs gaps over a second only: none is "under a
// second", reported as 0.
func longestGapAfter(log string, after int) time.Duration {
	var longest time.Duration
	for _, l := range strings.Split(log, "\n") {
		var ms, n int
		if _, err := fmt.Sscanf(l, "gap %dms before record %d", &ms, &n); err != nil || n <= after {
			continue
		}
		longest = max(longest, time.Duration(ms)*time.Millisecond)
	}
	return longest
}
