package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The driver's histograms (internal/metrics): CSI RPCs by method and gRPC
// code, external commands by command and exit code.
const (
	rpcMetric     = "spindle_rpc_duration_seconds"
	commandMetric = "spindle_command_duration_seconds"
)

// The RPCs each phase causes, in the order they happen.
var (
	applyMethods  = []string{"CreateVolume", "ControllerPublishVolume", "NodeStageVolume", "NodePublishVolume"}
	deleteMethods = []string{"NodeUnpublishVolume", "NodeUnstageVolume", "ControllerUnpublishVolume", "DeleteVolume"}
)

// rpcKey names one series: the method (or command) and its code (or exit code).
type rpcKey struct{ method, code string }

// histogram is one series: cumulative counts per upper bound, sorted.
type histogram struct {
	count   uint64
	sum     float64
	uppers  []float64
	buckets []uint64
}

// rpcSeries are the histograms of one metric from every endpoint, summed:
// the controller's and the node plugin's are different processes serving
// different methods.
type rpcSeries map[rpcKey]histogram

type scrape struct {
	series   rpcSeries // RPCs
	commands rpcSeries
	skipped  []string // the endpoints that did not answer, and why
}

// minus is what happened between two scrapes.
func (s scrape) minus(before scrape) scrape {
	return scrape{series: s.series.minus(before.series), commands: s.commands.minus(before.commands)}
}

// scrapeAll reads every endpoint; one that does not answer is skipped
// (with DEPLOY=process one driver serves both services on one port).
func scrapeAll(ctx context.Context, urls []string) scrape {
	out := scrape{series: rpcSeries{}, commands: rpcSeries{}}
	for _, u := range urls {
		fams, err := scrapeOne(ctx, u)
		if err != nil {
			out.skipped = append(out.skipped, fmt.Sprintf("%s (%v)", u, err))
			continue
		}
		out.series.add(fams[rpcMetric], "method", "code")
		out.commands.add(fams[commandMetric], "command", "exit_code")
	}
	return out
}

func scrapeOne(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(strings.NewReader(string(body)))
}

// add sums fam's histograms into s, keyed by the values of the labels
// name and code.
func (s rpcSeries) add(fam *dto.MetricFamily, name, code string) {
	for _, m := range fam.GetMetric() {
		h := m.GetHistogram()
		if h == nil {
			continue
		}
		var k rpcKey
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case name:
				k.method = l.GetValue()
			case code:
				k.code = l.GetValue()
			}
		}
		bs := slices.Clone(h.GetBucket())
		sort.Slice(bs, func(i, j int) bool { return bs[i].GetUpperBound() < bs[j].GetUpperBound() })
		got := histogram{count: h.GetSampleCount(), sum: h.GetSampleSum()}
		for _, b := range bs {
			got.uppers = append(got.uppers, b.GetUpperBound())
			got.buckets = append(got.buckets, b.GetCumulativeCount())
		}
		s[k] = s[k].plus(got, 1)
	}
}

// plus returns h + sign*o, bucket by bucket (the driver's buckets are the
// same in every process and every scrape).
func (h histogram) plus(o histogram, sign int) histogram {
	if h.uppers == nil {
		h.uppers = o.uppers
		h.buckets = make([]uint64, len(o.buckets))
	}
	out := histogram{uppers: h.uppers, buckets: make([]uint64, len(h.buckets))}
	apply := func(a, b uint64) uint64 {
		if sign < 0 {
			return a - min(a, b)
		}
		return a + b
	}
	out.count = apply(h.count, o.count)
	out.sum = h.sum + float64(sign)*o.sum
	for i := range out.buckets {
		var ob uint64
		if i < len(o.buckets) {
			ob = o.buckets[i]
		}
		out.buckets[i] = apply(h.buckets[i], ob)
	}
	return out
}

// minus is what happened between two scrapes.
func (s rpcSeries) minus(before rpcSeries) rpcSeries {
	out := rpcSeries{}
	for k, h := range s {
		if b, ok := before[k]; ok {
			h = h.plus(b, -1)
		}
		if h.count > 0 {
			out[k] = h
		}
	}
	return out
}

// quantile estimates the q-quantile as Prometheus's histogram_quantile
// does: linear within the bucket that holds the rank; in the +Inf bucket,
// the highest finite bound.
func (h histogram) quantile(q float64) time.Duration {
	if h.count == 0 {
		return 0
	}
	rank := q * float64(h.count)
	lower, below := 0.0, uint64(0)
	for i, upper := range h.uppers {
		c := h.buckets[i]
		if float64(c) >= rank {
			if math.IsInf(upper, 1) {
				return time.Duration(lower * float64(time.Second))
			}
			v := lower + (upper-lower)*(rank-float64(below))/float64(max(c-below, 1))
			return time.Duration(v * float64(time.Second))
		}
		lower, below = upper, c
	}
	return time.Duration(lower * float64(time.Second))
}

// printRPCs prints, per method, the successful calls' p50/p99 and mean and
// the failed calls by code: ABORTED and the like are the retries a
// serialised step causes.
func printRPCs(title string, s rpcSeries, methods []string) {
	fmt.Println()
	if len(s) == 0 {
		fmt.Printf("%s: none seen (or the driver's /metrics did not answer)\n", title)
		return
	}
	fmt.Printf("  %-38s %5s %9s %9s %9s  %s\n", title+" (histogram estimates)", "ok", "p50", "p99", "mean", "failed")
	for _, m := range methods {
		ok := s[rpcKey{m, "OK"}]
		var failed []string
		for k, h := range s {
			if k.method == m && k.code != "OK" {
				failed = append(failed, fmt.Sprintf("%d %s", h.count, k.code))
			}
		}
		sort.Strings(failed)
		fmt.Printf("  %-38s %5d %9s %9s %9s  %s\n", m, ok.count, millis(ok.quantile(.5)), millis(ok.quantile(.99)), millis(ok.mean()), strings.Join(failed, ", "))
	}
}

// printCommands prints every external command the driver ran: count,
// p50/p99 and mean of those that exited 0, and how many did not.
func printCommands(title string, s rpcSeries) {
	if len(s) == 0 {
		return
	}
	names := map[string]bool{}
	for k := range s {
		names[k.method] = true
	}
	fmt.Println()
	// Not every other exit status is a failure (blkid -p exits 2 on a blank
	// device, the check before every first format), so they are listed by
	// code rather than counted as failed.
	fmt.Printf("  %-38s %6s %9s %9s %9s  %s\n", title, "exit 0", "p50", "p99", "mean", "other exit codes: runs")
	for _, name := range slices.Sorted(maps.Keys(names)) {
		ok := s[rpcKey{name, "0"}]
		var others []string
		for _, k := range slices.SortedFunc(maps.Keys(s), func(a, b rpcKey) int { return strings.Compare(a.code, b.code) }) {
			if k.method == name && k.code != "0" && s[k].count > 0 {
				others = append(others, fmt.Sprintf("%s: %d", k.code, s[k].count))
			}
		}
		fmt.Printf("  %-38s %6d %9s %9s %9s  %s\n", name, ok.count, millis(ok.quantile(.5)), millis(ok.quantile(.99)), millis(ok.mean()), strings.Join(others, ", "))
	}
}

// mean is the average of the observations.
func (h histogram) mean() time.Duration {
	if h.count == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.count) * float64(time.Second))
}
