// Package metrics owns Spindle's Prometheus collectors. Every driver gets a
// registry of its own (never the global default), so two drivers in one test
// binary count independently.
//
// The names, for operators and dashboards:
//
//	spindle_rpc_duration_seconds{method,code}            histogram, every CSI RPC
//	spindle_rpc_errors_total{method,reason}               counter, RPCs that failed, by error kind
//	spindle_command_duration_seconds{command,exit_code}   histogram, every external command
//	spindle_format_operations_total{fs_type,result}       counter, mkfs runs (result success|failure)
//	spindle_volumes_staged{backend}                       gauge, stage records on this node
//	spindle_volumes_attached{backend}                     gauge, volumes with a device on this node
//	spindle_volume_state_scrape_errors_total              counter, gauges that could not be computed
//	spindle_background_tasks{backend,action,state}        gauge, a controller's backends' background work (flatten, remove), state running|queued
//	spindle_background_task_progress_ratio{backend,action,image}  gauge, each task's fraction done (0-1; -1 when its runner does not say)
//	spindle_background_task_scrape_errors_total           counter, scrapes at which a backend could not list its tasks
//
// plus the Go runtime and process collectors.
package metrics

import (
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

const namespace = "spindle"

// Format results.
const (
	FormatSuccess = "success"
	FormatFailure = "failure"
)

// Metrics holds one driver's collectors and their registry.
type Metrics struct {
	Registry *prometheus.Registry

	rpcDuration     *prometheus.HistogramVec
	rpcErrors       *prometheus.CounterVec
	commandDuration *prometheus.HistogramVec
	formats         *prometheus.CounterVec
	stateErrors     prometheus.Counter

	taskErrors prometheus.Counter

	mu    sync.Mutex
	state func() (VolumeCounts, error)
	tasks func() ([]BackgroundTask, error)
}

// BackgroundTask is one piece of a backend's background work, as a
// controller reports it.
type BackgroundTask struct {
	Backend    string // the backend instance, "rbd/ceph-a"
	Action     string // flatten, remove
	Image      string
	Progress   float64 // 0-1; -1 unknown
	InProgress bool
}

// VolumeCounts are the node's volumes by backend instance key ("loop/default").
type VolumeCounts struct {
	Staged   map[string]int
	Attached map[string]int
}

// New builds the collectors and registers them in a fresh registry.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		rpcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "rpc_duration_seconds",
			Help: "Duration of CSI RPCs, by method and gRPC code.",
			// Identity calls take microseconds, a stage with mkfs seconds.
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"method", "code"}),
		rpcErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "rpc_errors_total",
			Help: "CSI RPCs that failed, by method and reason (the kind of error: not_found, precondition, busy, ...; internal when it has none).",
		}, []string{"method", "reason"}),
		commandDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "command_duration_seconds",
			Help:    "Duration of external commands (losetup, blkid, mkfs.*, ...), by command and exit code (-1: killed, timed out or not started).",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 600},
		}, []string{"command", "exit_code"}),
		formats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "format_operations_total",
			Help: "Filesystems created on volumes (mkfs runs), by fs type and result.",
		}, []string{"fs_type", "result"}),
		stateErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "volume_state_scrape_errors_total",
			Help: "Scrapes at which the staged and attached volume gauges could not be computed.",
		}),
		taskErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "background_task_scrape_errors_total",
			Help: "Scrapes at which a backend could not list its background tasks.",
		}),
	}
	m.Registry.MustRegister(m.rpcDuration, m.rpcErrors, m.commandDuration, m.formats, m.stateErrors, m.taskErrors,
		&volumeCollector{m: m}, &taskCollector{m: m},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// ObserveRPC records one RPC. reason is "" for a success.
func (m *Metrics) ObserveRPC(method, code, reason string, d time.Duration) {
	m.rpcDuration.WithLabelValues(method, code).Observe(d.Seconds())
	if reason != "" {
		m.rpcErrors.WithLabelValues(method, reason).Inc()
	}
}

// ObserveCommand records one external command.
func (m *Metrics) ObserveCommand(name string, exitCode int, d time.Duration) {
	m.commandDuration.WithLabelValues(name, strconv.Itoa(exitCode)).Observe(d.Seconds())
}

// ObserveFormat records one mkfs run.
func (m *Metrics) ObserveFormat(fsType string, err error) {
	result := FormatSuccess
	if err != nil {
		result = FormatFailure
	}
	m.formats.WithLabelValues(fsType, result).Inc()
}

// SetVolumeState installs the function the staged and attached gauges are
// computed from at every scrape. They are read from the node (stage
// records, devices) rather than counted along the RPCs, so they are right
// after a restart and cannot drift.
func (m *Metrics) SetVolumeState(fn func() (VolumeCounts, error)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.state = fn
}

var (
	stagedDesc   = prometheus.NewDesc(namespace+"_volumes_staged", "Volumes staged on this node (live stage records), by backend instance.", []string{"backend"}, nil)
	attachedDesc = prometheus.NewDesc(namespace+"_volumes_attached", "Volumes with at least one device attached on this node, by backend instance.", []string{"backend"}, nil)
)

// volumeCollector computes the node's volume gauges at scrape time.
type volumeCollector struct{ m *Metrics }

func (c *volumeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- stagedDesc
	ch <- attachedDesc
}

func (c *volumeCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	fn := c.m.state
	c.m.mu.Unlock()
	if fn == nil {
		return // a controller: no node-side volumes
	}
	counts, err := fn()
	if err != nil {
		c.m.stateErrors.Inc()
	}
	emit := func(desc *prometheus.Desc, byBackend map[string]int) {
		keys := make([]string, 0, len(byBackend))
		for k := range byBackend {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, float64(byBackend[k]), k)
		}
	}
	emit(stagedDesc, counts.Staged)
	emit(attachedDesc, counts.Attached)
}

// SetBackgroundTasks installs the function the background-task gauges are
// computed from at every scrape (a controller's; nil on a node plugin).
// They are read from the backends, which keep their tasks across restarts
// of the driver, so they cannot drift.
func (m *Metrics) SetBackgroundTasks(fn func() ([]BackgroundTask, error)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tasks = fn
}

// Task states of the spindle_background_tasks gauge.
const (
	TaskRunning = "running"
	TaskQueued  = "queued"
)

var (
	tasksDesc = prometheus.NewDesc(namespace+"_background_tasks",
		"Background work of the controller's backends (flattening a copy-on-write clone, removing a deleted image), by backend instance, action and state (running, queued).",
		[]string{"backend", "action", "state"}, nil)
	taskProgressDesc = prometheus.NewDesc(namespace+"_background_task_progress_ratio",
		"Fraction done of each background task, 0 to 1 (-1 when its runner does not say), by backend instance, action and image.",
		[]string{"backend", "action", "image"}, nil)
)

// taskCollector computes the background-task gauges at scrape time.
type taskCollector struct{ m *Metrics }

func (c *taskCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- tasksDesc
	ch <- taskProgressDesc
}

func (c *taskCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	fn := c.m.tasks
	c.m.mu.Unlock()
	if fn == nil {
		return
	}
	tasks, err := fn()
	if err != nil {
		c.m.taskErrors.Inc()
	}
	type key struct{ backend, action, state string }
	counts := map[key]int{}
	seen := map[[3]string]bool{}
	for _, t := range tasks {
		state := TaskQueued
		if t.InProgress {
			state = TaskRunning
		}
		counts[key{t.Backend, t.Action, state}]++
		id := [3]string{t.Backend, t.Action, t.Image}
		if !seen[id] { // one series per task, whatever the backend lists twice
			seen[id] = true
			ch <- prometheus.MustNewConstMetric(taskProgressDesc, prometheus.GaugeValue, t.Progress, t.Backend, t.Action, t.Image)
		}
	}
	keys := make([]key, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].backend+keys[i].action+keys[i].state < keys[j].backend+keys[j].action+keys[j].state
	})
	for _, k := range keys {
		ch <- prometheus.MustNewConstMetric(tasksDesc, prometheus.GaugeValue, float64(counts[k]), k.backend, k.action, k.state)
	}
}
