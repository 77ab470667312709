package harness

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// rpcLatencies collects the duration of every successful RPC an in-process
// driver logs (its "rpc" entries with code OK), whoever the client is: the
// harness's own, csi-sanity's, a lifecycle test's. A test's log then ends
// with each method's p50, which is how `make vmtest` reports NodeStage and
// NodeUnstage per attach mode on a real kernel without scraping /metrics.
type rpcLatencies struct {
	mu       sync.Mutex
	byMethod map[string][]time.Duration
}

func (r *rpcLatencies) add(method string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byMethod == nil {
		r.byMethod = map[string][]time.Duration{}
	}
	r.byMethod[method] = append(r.byMethod[method], d)
}

// Lines are "rpc <method>: n=N p50=D max=D", one per method, sorted by name.
func (r *rpcLatencies) Lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	methods := make([]string, 0, len(r.byMethod))
	for m := range r.byMethod {
		methods = append(methods, m)
	}
	sort.Strings(methods)
	lines := make([]string, 0, len(methods))
	for _, m := range methods {
		ds := slices.Clone(r.byMethod[m])
		slices.Sort(ds)
		// Nearest rank: the median of an even count is its lower middle.
		p50 := ds[(len(ds)-1)/2]
		lines = append(lines, fmt.Sprintf("rpc %s: n=%d p50=%s max=%s", m, len(ds), round(p50), round(ds[len(ds)-1])))
	}
	return lines
}

func round(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(10 * time.Microsecond)
}

// recordLatencies tees logger into a core that records every "rpc" entry,
// at any level the driver logs it, and logs the per-method lines when the
// test ends (after the driver has stopped: this cleanup is registered
// first).
func recordLatencies(t testing.TB, logger *zap.Logger) *zap.Logger {
	rec := &rpcLatencies{}
	t.Cleanup(func() {
		for _, l := range rec.Lines() {
			t.Log(l)
		}
	})
	return logger.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewTee(c, &latencyCore{LevelEnabler: zapcore.InfoLevel, rec: rec})
	}))
}

// latencyCore is a zapcore.Core that writes nothing: it reads the method,
// code and duration fields of the driver's "rpc" entries.
type latencyCore struct {
	zapcore.LevelEnabler
	rec    *rpcLatencies
	fields []zapcore.Field
}

func (c *latencyCore) With(fields []zapcore.Field) zapcore.Core {
	return &latencyCore{LevelEnabler: c.LevelEnabler, rec: c.rec, fields: append(slices.Clone(c.fields), fields...)}
}

func (c *latencyCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Message == "rpc" && c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *latencyCore) Write(_ zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range append(slices.Clone(c.fields), fields...) {
		f.AddTo(enc)
	}
	method, _ := enc.Fields["method"].(string)
	code, _ := enc.Fields["code"].(string)
	d, ok := enc.Fields["duration"].(time.Duration)
	if method != "" && code == "OK" && ok {
		c.rec.add(method, d)
	}
	return nil
}

func (c *latencyCore) Sync() error { return nil }
