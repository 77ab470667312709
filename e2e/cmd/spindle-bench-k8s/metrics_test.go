package main

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Two scrapes of the driver's histogram: the difference is what happened
// between them, and its quantiles are histogram_quantile's.
func TestRPCHistogramDelta(t *testing.T) {
	scrapeText := func(text string) rpcSeries {
		t.Helper()
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		s := rpcSeries{}
		s.add(fams[rpcMetric], "method", "code")
		return s
	}
	const header = "# TYPE spindle_rpc_duration_seconds histogram\n"
	series := func(code string, b01, b1, inf int, sum float64) string {
		l := `method="NodeStageVolume",code="` + code + `"`
		return strings.NewReplacer("L", l).Replace(
			"spindle_rpc_duration_seconds_bucket{L,le=\"0.1\"} " + strconv.Itoa(b01) + "\n" +
				"spindle_rpc_duration_seconds_bucket{L,le=\"1\"} " + strconv.Itoa(b1) + "\n" +
				"spindle_rpc_duration_seconds_bucket{L,le=\"+Inf\"} " + strconv.Itoa(inf) + "\n" +
				"spindle_rpc_duration_seconds_sum{L} " + ftoa(sum) + "\n" +
				"spindle_rpc_duration_seconds_count{L} " + strconv.Itoa(inf) + "\n")
	}
	before := scrapeText(header + series("OK", 5, 5, 5, 0.25))
	after := scrapeText(header + series("OK", 55, 105, 105, 60.25) + series("Aborted", 3, 3, 3, 0.01))
	d := after.minus(before)
	ok := d[rpcKey{"NodeStageVolume", "OK"}]
	if ok.count != 100 || math.Abs(ok.sum-60) > 1e-9 {
		t.Fatalf("delta count %d sum %v, want 100 and 60", ok.count, ok.sum)
	}
	// 50 in (0, 0.1], 50 in (0.1, 1]: the median is the top of the first
	// bucket, p99 98% of the way through the second.
	if got := ok.quantile(.5); got != 100*time.Millisecond {
		t.Errorf("p50 %v, want 100ms", got)
	}
	if got, want := ok.quantile(.99), time.Duration((0.1+0.9*49.0/50)*float64(time.Second)); (got - want).Abs() > time.Microsecond {
		t.Errorf("p99 %v, want %v", got, want)
	}
	if got := d[rpcKey{"NodeStageVolume", "Aborted"}].count; got != 3 {
		t.Errorf("Aborted delta %d, want 3", got)
	}
	// Everything above the last finite bound: that bound, as Prometheus says.
	inf := scrapeText(header + series("OK", 0, 0, 4, 20))[rpcKey{"NodeStageVolume", "OK"}]
	if got := inf.quantile(.5); got != time.Second {
		t.Errorf("p50 in the +Inf bucket %v, want 1s", got)
	}
}

func TestDurationsNearestRank(t *testing.T) {
	var d durations
	base := time.Now()
	for i := 1; i <= 100; i++ {
		d.add(base, base.Add(time.Duration(i)*time.Millisecond))
	}
	d.add(base, time.Time{})
	if d.quantile(.5) != 50*time.Millisecond || d.quantile(.99) != 99*time.Millisecond || d.quantile(1) != 100*time.Millisecond {
		t.Errorf("p50 %v p99 %v max %v", d.quantile(.5), d.quantile(.99), d.quantile(1))
	}
	if d.missing != 1 {
		t.Errorf("missing %d, want 1", d.missing)
	}
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
