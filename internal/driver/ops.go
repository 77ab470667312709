package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/metrics"
	"github.com/spindle-csi/spindle/internal/node"
	"github.com/spindle-csi/spindle/internal/opsapi"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// maxOpsRequest bounds the body of a POST to the operators' endpoints.
const maxOpsRequest = 64 << 10

// opsTimeout bounds one request to the operators' endpoints: a probe or an
// inventory that hangs on a dead backend answers with an error instead.
const opsTimeout = 10 * time.Second

// inventoryTimeout bounds the node's inventory (/volumes), which checks
// every staged volume: more than opsTimeout, since one rbd-nbd device list
// took up to 12 s on make e2e-multinode's emulated workers; less than
// kubectl-spindle's 20 s wait for it, so a slow check still comes back as
// that volume's problem rather than as no answer.
const inventoryTimeout = 18 * time.Second

// MetricsAddress is the address the operators' endpoints listen on ("" until
// Run has opened it, or when --metrics-address is empty).
func (d *Driver) MetricsAddress() string {
	d.opsAddrMu.Lock()
	defer d.opsAddrMu.Unlock()
	return d.opsAddr
}

// OpsHandler serves /metrics, /healthz and, by mode, /volumes and /images.
func (d *Driver) OpsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET "+opsapi.PathMetrics, promhttp.HandlerFor(d.metrics.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET "+opsapi.PathHealthz, d.serveHealthz)
	if d.opts.Mode.Node() {
		mux.HandleFunc("GET "+opsapi.PathVolumes, func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), inventoryTimeout)
			defer cancel()
			writeJSON(w, d.NodeVolumes(ctx))
		})
	}
	d.registerRotation(mux)
	if d.opts.Mode.Controller() {
		mux.HandleFunc("POST "+opsapi.PathAdopt, servePost(d, adoptTimeout, d.adopt)) // adopt.go
		mux.HandleFunc("GET "+opsapi.PathImages, func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), opsTimeout)
			defer cancel()
			writeJSON(w, d.Images(ctx))
		})
	}
	return mux
}

// serveOps listens on addr and serves OpsHandler until the returned stop
// is called.
func (d *Driver) serveOps(addr string) (stop func(), err error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	d.opsAddrMu.Lock()
	d.opsAddr = lis.Addr().String()
	d.opsAddrMu.Unlock()
	srv := &http.Server{Handler: d.OpsHandler(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("metrics endpoint stopped", zap.Error(err))
		}
	}()
	d.log.Info("serving metrics and health", zap.String("address", lis.Addr().String()))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

// serveHealthz answers 200 "ok" when every backend this process serves
// answers its probe (the same check as the Probe RPC), and 503 with the
// reason otherwise.
func (d *Driver) serveHealthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), opsTimeout)
	defer cancel()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := d.probe(ctx); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "unhealthy: %v\n", err)
		return
	}
	fmt.Fprintln(w, "ok")
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// attachedDevices lists every device each backend instance holds on this
// node; the instances that cannot say are reported as errors.
func (d *Driver) attachedDevices(ctx context.Context) ([]opsapi.AttachedDevice, []error) {
	var out []opsapi.AttachedDevice
	var errs []error
	for _, key := range d.instances.Keys() {
		lister, ok := d.instances[key].Attacher.(backend.DeviceLister)
		if !ok {
			continue
		}
		devs, err := lister.AttachedDevices(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("list the devices of %s: %w", key, err))
			continue
		}
		for _, dev := range devs {
			out = append(out, opsapi.AttachedDevice{
				Backend: key, Image: dev.ImageID, VolumeID: key + "/" + dev.ImageID,
				Device: dev.Path, ReadOnly: dev.ReadOnly, ImageDeleted: dev.ImageDeleted,
			})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Backend != out[j].Backend {
			return out[i].Backend < out[j].Backend
		}
		return out[i].Device < out[j].Device
	})
	return out, errs
}

// volumeCounts computes the staged and attached gauges: stage records per
// backend instance, and volumes with at least one device per instance.
// Every configured instance is reported, at 0 when it has none.
func (d *Driver) volumeCounts() (metrics.VolumeCounts, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opsTimeout)
	defer cancel()
	counts := metrics.VolumeCounts{Staged: map[string]int{}, Attached: map[string]int{}}
	for _, key := range d.instances.Keys() {
		counts.Staged[key], counts.Attached[key] = 0, 0
	}
	var errs []error
	ids, err := d.node.StagedVolumeIDs()
	if err != nil {
		errs = append(errs, err)
	}
	for _, s := range ids {
		if id, err := volumeid.Parse(s); err == nil {
			counts.Staged[id.InstanceKey()]++
		}
	}
	devs, derrs := d.attachedDevices(ctx)
	errs = append(errs, derrs...)
	seen := map[string]bool{}
	for _, dev := range devs {
		if !seen[dev.VolumeID] {
			seen[dev.VolumeID] = true
			counts.Attached[dev.Backend]++
		}
	}
	return counts, errors.Join(errs...)
}

// NodeVolumes is the node's inventory (the /volumes document): each stage
// record checked against the mount table and the backend, and every device
// the backends hold.
func (d *Driver) NodeVolumes(ctx context.Context) opsapi.NodeVolumes {
	// One look: each listing the volumes' checks share is made once.
	ctx = backend.WithListingMemo(ctx)
	out := opsapi.NodeVolumes{
		Version: opsapi.FormatVersion, Driver: d.opts.DriverName, Node: d.opts.NodeID,
		GeneratedAt: time.Now().UTC().Truncate(time.Second),
		Staged:      []opsapi.StagedVolume{}, Devices: []opsapi.AttachedDevice{},
	}
	staged, errs := d.node.Staged(ctx, d.resolveVolume)
	out.Staged = staged
	out.Errors = append(out.Errors, errs...)
	devs, derrs := d.attachedDevices(ctx)
	if devs != nil {
		out.Devices = devs
	}
	for _, err := range derrs {
		out.Errors = append(out.Errors, err.Error())
	}
	return out
}

// resolveVolume is the node side's handle of the volume a record names.
func (d *Driver) resolveVolume(volumeID string) (node.Volume, error) {
	id, err := volumeid.Parse(volumeID)
	if err != nil {
		return node.Volume{}, err
	}
	inst, err := d.instances.Serving(id)
	if err != nil {
		return node.Volume{}, err
	}
	return volume(id, inst), nil
}

// ownerOf names the volume whose device dev is, for refusals that say
// whose a path is: the backends that can list their devices on this node
// are asked (a scan, but only when a request is refused).
func (d *Driver) ownerOf(ctx context.Context, dev string) string {
	devs, _ := d.attachedDevices(ctx)
	for _, a := range devs {
		if a.Device == dev {
			return a.VolumeID
		}
	}
	return ""
}

// Images lists every image of every backend instance (the /images document).
func (d *Driver) Images(ctx context.Context) opsapi.Images {
	out := opsapi.Images{
		Version: opsapi.FormatVersion, Driver: d.opts.DriverName,
		GeneratedAt: time.Now().UTC().Truncate(time.Second),
		Backends:    []opsapi.BackendImages{},
	}
	for _, key := range d.instances.Keys() {
		b := opsapi.BackendImages{Backend: key, Images: []opsapi.Image{}}
		imgs, err := d.instances[key].Store.List(ctx)
		if err != nil {
			b.Error = err.Error()
		}
		for _, img := range imgs {
			i := opsapi.Image{VolumeID: key + "/" + img.ID, Image: img.ID, Name: img.Name, CapacityBytes: img.CapacityBytes}
			for _, a := range img.Attachments {
				i.PublishedTo = append(i.PublishedTo, a.NodeID)
			}
			b.Images = append(b.Images, i)
		}
		d.addTasks(ctx, &b)
		out.Backends = append(out.Backends, b)
	}
	return out
}

// addTasks puts an instance's background tasks into its part of the
// /images document: all of them, and each volume's with the volume.
func (d *Driver) addTasks(ctx context.Context, b *opsapi.BackendImages) {
	tasks, ok, err := d.ctrl.Tasks(ctx, b.Backend)
	if !ok {
		return
	}
	if err != nil {
		b.TasksError = err.Error()
	}
	byImage := map[string][]opsapi.Task{}
	for _, t := range tasks {
		o := opsapi.Task{Action: t.Action, Image: t.Image, Progress: t.Progress, InProgress: t.InProgress, Runner: t.Runner, Message: t.Message, Since: t.Since}
		b.Tasks = append(b.Tasks, o)
		byImage[t.Image] = append(byImage[t.Image], o)
	}
	for i := range b.Images {
		b.Images[i].Tasks = byImage[b.Images[i].Image]
	}
}

// servePost decodes a bounded JSON request (unknown fields refused), runs
// handle within timeout and writes its answer, or the error with the
// status its kind maps to: the POST endpoints (adopt, key rotation).
func servePost[Req, Resp any](d *Driver, timeout time.Duration, handle func(context.Context, Req) (Resp, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		var req Req
		dec := json.NewDecoder(io.LimitReader(r.Body, maxOpsRequest))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeOpsError(w, errdefs.InvalidArgument("request body: %v", err))
			return
		}
		resp, err := handle(ctx, req)
		if err != nil {
			d.log.Warn("operators' request failed", zap.String("path", r.URL.Path), zap.Error(err))
			writeOpsError(w, err)
			return
		}
		writeJSON(w, resp)
	}
}

func writeOpsError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch errdefs.KindOf(err) {
	case errdefs.ErrInvalidArgument:
		status = http.StatusBadRequest
	case errdefs.ErrNotFound:
		status = http.StatusNotFound
	case errdefs.ErrBusy:
		status = http.StatusConflict
	case errdefs.ErrPrecondition, errdefs.ErrAlreadyExists:
		status = http.StatusPreconditionFailed
	case errdefs.ErrUnavailable:
		status = http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(opsapi.Error{Error: err.Error()})
}
