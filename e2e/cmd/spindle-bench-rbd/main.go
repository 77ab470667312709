//go:build cgo && ceph

// Command spindle-bench-rbd measures Spindle's RBD controller side by side
// with ceph-csi's (the reference RBD driver, cgo over librbd too) on one
// throw-away Ceph cluster, in one run (`make bench`): both drivers get the
// same CSI requests (ceph-csi's parameters clusterID, pool, imageFeatures
// and secrets userID/userKey, as a Rook StorageClass gives them), in
// rounds that alternate which driver goes first, and it prints, per
// operation, the median of each and the ratio:
//
//	rbd CreateVolume: spindle 21 ms, ceph-csi 30 ms (0.70x)
//
// CreateVolume 1 GiB, CreateSnapshot of a volume holding data, CreateVolume
// from that snapshot, DeleteSnapshot, DeleteVolume, and N CreateVolume and
// N DeleteVolume at once; then each driver's CPU time and resident memory.
// It runs inside a Ceph root (hack/ceph/run), whose client libraries both
// drivers use. ceph-csi's binary is taken from -ceph-csi (its source is not
// part of Spindle: build it from ceph-csi's repository, docs/benchmarks.md
// says how); without it, Spindle's figures alone are printed. ceph-csi
// runs in a mount namespace of its own with /etc/ceph-csi-config, /etc/ceph
// and /tmp/csi on tmpfs, so it leaves nothing behind. It asserts nothing
// about time.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/spindle-csi/spindle/internal/ceph/cephtest"
)

type options struct {
	spindle  string
	cephCSI  string
	n        int
	warmup   int
	parallel int
	batches  int
	sizeMiB  int64
	dataMiB  int64
	rounds   int
}

func main() {
	var o options
	flag.StringVar(&o.spindle, "driver", "bin/spindle", "the spindle binary (built with its Ceph client: make build)")
	flag.StringVar(&o.cephCSI, "ceph-csi", os.Getenv("CEPH_CSI"), "ceph-csi's cephcsi binary (none: Spindle's figures alone)")
	flag.IntVar(&o.n, "n", 20, "measured operations of each kind per round and driver")
	flag.IntVar(&o.warmup, "warmup", 2, "operations of each kind before the measured ones")
	flag.IntVar(&o.parallel, "parallel", 20, "CreateVolume calls at once (and as many deletes)")
	flag.IntVar(&o.batches, "batches", 5, "batches of parallel calls per round and driver")
	flag.Int64Var(&o.sizeMiB, "size-mib", 1024, "size of each volume")
	flag.Int64Var(&o.dataMiB, "data-mib", 1024, "data written into the volume that is snapshotted")
	flag.IntVar(&o.rounds, "rounds", 2, "rounds, each driver going first in turn")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "spindle-bench-rbd: %v\n", err)
		os.Exit(1)
	}
}

// driver is one CSI controller under test.
type driver struct {
	name string
	cmd  *exec.Cmd
	ctrl csi.ControllerClient
	conn *grpc.ClientConn
	// secrets and parameters of every request.
	secrets map[string]string
	params  map[string]string
	// volumeID of the data volume whose snapshots are measured.
	dataVolume string
	times      map[string][]time.Duration
}

func run(o options) error {
	if cephtest.InCephRoot() == "" {
		return errors.New("not inside a Ceph root: run it as `hack/ceph/run bin/spindle-bench-rbd` (make bench does)")
	}
	// Ceph's default monitor commit interval, as users' clusters run
	// (cephtest shortens it for tests).
	if os.Getenv("MON_PROPOSE_INTERVAL") == "" {
		os.Setenv("MON_PROPOSE_INTERVAL", "1")
	}
	cl, err := cephtest.Start(8 << 30)
	if err != nil {
		return err
	}
	defer cl.Stop()
	work, err := os.MkdirTemp("", "spindle-bench-rbd-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	fmt.Printf("RBD controllers side by side on Ceph %s (client %s), pool %s: %d rounds, medians of %d after %d warm-ups (of %d batches for the calls at once)\n\n",
		cl.Release, cl.ClientRelease, cl.Pool, o.rounds, o.n*o.rounds, o.warmup, o.batches*o.rounds)

	params := map[string]string{"clusterID": "bench", "pool": cl.Pool, "imageFeatures": "layering"}
	secrets := map[string]string{"userID": cl.User, "userKey": cl.Key}
	sp, err := startSpindle(o, cl, work)
	if err != nil {
		return err
	}
	sp.params, sp.secrets = params, secrets
	defer sp.stop()
	drivers := []*driver{sp}
	if o.cephCSI != "" {
		cc, err := startCephCSI(o, cl, work)
		if err != nil {
			return err
		}
		cc.params, cc.secrets = params, secrets
		defer cc.stop()
		drivers = append(drivers, cc)
	} else {
		fmt.Printf("(no ceph-csi binary: -ceph-csi or CEPH_CSI names one; Spindle alone)\n\n")
	}
	ctx := context.Background()
	for _, d := range drivers {
		if err := d.prepare(ctx, cl, o); err != nil {
			return fmt.Errorf("%s: %w", d.name, err)
		}
	}
	for round := 0; round < o.rounds; round++ {
		order := slices.Clone(drivers)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, d := range order {
			if err := d.round(ctx, o, round); err != nil {
				return fmt.Errorf("%s, round %d: %w", d.name, round+1, err)
			}
		}
	}
	ops := []string{"CreateVolume", "DeleteVolume", "CreateSnapshot", "CreateVolume from snapshot", "DeleteSnapshot",
		fmt.Sprintf("%d CreateVolume at once", o.parallel), fmt.Sprintf("%d DeleteVolume at once", o.parallel)}
	for _, op := range ops {
		line := "rbd " + op + ":"
		for _, d := range drivers {
			line += fmt.Sprintf(" %s %s,", d.name, ms(median(d.times[op])))
		}
		line = strings.TrimSuffix(line, ",")
		if len(drivers) == 2 {
			line += fmt.Sprintf(" (%.2fx)", float64(median(drivers[0].times[op]))/float64(median(drivers[1].times[op])))
		}
		fmt.Println(line)
	}
	fmt.Println()
	for _, d := range drivers {
		cpu, rss := usage(d.cmd.Process.Pid)
		fmt.Printf("%s: CPU %.1f s, RSS %.1f MiB\n", d.name, cpu.Seconds(), float64(rss)/(1<<20))
	}
	for _, d := range drivers {
		if err := d.cleanup(ctx); err != nil {
			fmt.Printf("%s: cleanup: %v\n", d.name, err)
		}
	}
	return nil
}

func startSpindle(o options, cl *cephtest.Cluster, work string) (*driver, error) {
	dir := filepath.Join(work, "spindle")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`backends:
  - type: rbd
    name: bench
    rbd:
      clusterID: bench
      monitors: [%q]
      pool: %s
      userID: %s
      keyFile: %s
`, cl.Monitor, cl.Pool, cl.User, cl.KeyFile)), 0o600); err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "csi.sock")
	cmd := exec.Command(o.spindle, "--mode=controller", "--endpoint=unix://"+sock, "--node-id=bench", "--config="+config,
		"--loop-pool-dir="+filepath.Join(dir, "pool"), "--log-level=warn")
	return start("spindle", cmd, dir, sock)
}

// startCephCSI runs ceph-csi's RBD controller in a mount namespace of its
// own: it reads its cluster map from /etc/ceph-csi-config, writes
// /etc/ceph and keeps its key files in /tmp/csi/keys.
func startCephCSI(o options, cl *cephtest.Cluster, work string) (*driver, error) {
	dir := filepath.Join(work, "ceph-csi")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	cfg, _ := json.Marshal([]map[string]any{{"clusterID": "bench", "monitors": []string{cl.Monitor}}})
	sock := filepath.Join(dir, "csi.sock")
	script := `set -e
for d in /etc/ceph-csi-config /etc/ceph /tmp/csi; do mkdir -p $d; mount -t tmpfs tmpfs $d; done
mkdir -p /tmp/csi/keys
printf '%s' "$CONFIG" > /etc/ceph-csi-config/config.json
exec "$@"`
	cmd := exec.Command("unshare", "--mount", "--propagation", "unchanged", "sh", "-c", script, "ceph-csi",
		o.cephCSI, "--type=rbd", "--controllerserver=true", "--nodeserver=false", "--endpoint=unix://"+sock,
		"--drivername=rbd.csi.ceph.com", "--nodeid=bench", "--instanceid=bench", "--v=1")
	cmd.Env = append(os.Environ(), "CONFIG="+string(cfg))
	return start("ceph-csi", cmd, dir, sock)
}

func start(name string, cmd *exec.Cmd, dir, sock string) (*driver, error) {
	logFile, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) || cmd.ProcessState != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			b, _ := os.ReadFile(logFile.Name())
			return nil, fmt.Errorf("%s did not serve %s within a minute: %s", name, sock, tail(string(b)))
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &driver{name: name, cmd: cmd, conn: conn, ctrl: csi.NewControllerClient(conn), times: map[string][]time.Duration{}}, nil
}

func tail(s string) string {
	if len(s) > 2000 {
		return "..." + s[len(s)-2000:]
	}
	return s
}

func (d *driver) stop() {
	_ = d.conn.Close()
	_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

var capability = []*csi.VolumeCapability{{
	AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}}

func (d *driver) create(ctx context.Context, name string, size int64, src *csi.VolumeContentSource) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	res, err := d.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: capability, Parameters: d.params, Secrets: d.secrets, VolumeContentSource: src})
	if err != nil {
		return "", fmt.Errorf("CreateVolume %s: %w", name, err)
	}
	return res.Volume.VolumeId, nil
}

func (d *driver) delete(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	// The sidecar retries an ABORTED or FAILED_PRECONDITION delete (a
	// clone still being detached); so does the benchmark, and counts the
	// whole.
	for {
		_, err := d.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id, Secrets: d.secrets})
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("DeleteVolume %s: %w", id, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// prepare makes the volume whose snapshots are measured and writes data
// into it.
func (d *driver) prepare(ctx context.Context, cl *cephtest.Cluster, o options) error {
	id, err := d.create(ctx, "bench-data-"+d.name, o.sizeMiB<<20, nil)
	if err != nil {
		return err
	}
	d.dataVolume = id
	image, err := d.imageOf(ctx, cl, id)
	if err != nil {
		return err
	}
	_, err = cl.RBD(ctx, "bench", "--io-type", "write", "--io-size", "4M", "--io-total", strconv.FormatInt(o.dataMiB<<20, 10), "--io-pattern", "seq", cl.Pool+"/"+image)
	return err
}

// imageOf finds the image of a volume: Spindle's IDs end in it; ceph-csi's
// name the image in the volume context, read back here by name.
func (d *driver) imageOf(ctx context.Context, cl *cephtest.Cluster, id string) (string, error) {
	if d.name == "spindle" {
		return id[strings.LastIndex(id, "/")+1:], nil
	}
	// ceph-csi: csi-vol-<uuid>, the uuid being the last 36 characters of
	// its volume ID.
	if len(id) < 36 {
		return "", fmt.Errorf("ceph-csi volume ID %q", id)
	}
	return "csi-vol-" + id[len(id)-36:], nil
}

func (d *driver) timed(op string, measured bool, fn func() error) error {
	t0 := time.Now()
	if err := fn(); err != nil {
		return err
	}
	if measured {
		d.times[op] = append(d.times[op], time.Since(t0))
	}
	return nil
}

// round runs warm-ups and n measured operations of each kind, then the
// parallel batch.
func (d *driver) round(ctx context.Context, o options, round int) error {
	size := o.sizeMiB << 20
	for i := 0; i < o.warmup+o.n; i++ {
		measured := i >= o.warmup
		name := fmt.Sprintf("bench-%d-%d", round, i)
		var vol, snap, restored string
		if err := d.timed("CreateVolume", measured, func() (err error) {
			vol, err = d.create(ctx, name, size, nil)
			return err
		}); err != nil {
			return err
		}
		if err := d.timed("CreateSnapshot", measured, func() error {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			defer cancel()
			res, err := d.ctrl.CreateSnapshot(cctx, &csi.CreateSnapshotRequest{Name: name + "-snap", SourceVolumeId: d.dataVolume,
				Secrets: d.secrets, Parameters: map[string]string{"clusterID": "bench"}})
			if err != nil {
				return fmt.Errorf("CreateSnapshot: %w", err)
			}
			if !res.Snapshot.ReadyToUse {
				return fmt.Errorf("CreateSnapshot %s: not ready to use", res.Snapshot.SnapshotId)
			}
			snap = res.Snapshot.SnapshotId
			return nil
		}); err != nil {
			return err
		}
		if err := d.timed("CreateVolume from snapshot", measured, func() (err error) {
			restored, err = d.create(ctx, name+"-restored", size, &csi.VolumeContentSource{
				Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap}}})
			return err
		}); err != nil {
			return err
		}
		if err := d.timed("DeleteSnapshot", measured, func() error {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			defer cancel()
			_, err := d.ctrl.DeleteSnapshot(cctx, &csi.DeleteSnapshotRequest{SnapshotId: snap, Secrets: d.secrets})
			return err
		}); err != nil {
			return err
		}
		if err := d.timed("DeleteVolume", measured, func() error { return d.delete(ctx, vol) }); err != nil {
			return err
		}
		if err := d.delete(ctx, restored); err != nil {
			return err
		}
	}
	ids := make([]string, o.parallel)
	errs := make([]error, o.parallel)
	batch := func(op string, fn func(i int) error) error {
		var wg sync.WaitGroup
		t0 := time.Now()
		for i := range ids {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = fn(i) }()
		}
		wg.Wait()
		d.times[op] = append(d.times[op], time.Since(t0))
		return errors.Join(errs...)
	}
	for b := range o.batches {
		if err := batch(fmt.Sprintf("%d CreateVolume at once", o.parallel), func(i int) (err error) {
			ids[i], err = d.create(ctx, fmt.Sprintf("bench-par-%d-%d-%d", round, b, i), size, nil)
			return err
		}); err != nil {
			return err
		}
		if err := batch(fmt.Sprintf("%d DeleteVolume at once", o.parallel), func(i int) error { return d.delete(ctx, ids[i]) }); err != nil {
			return err
		}
	}
	return nil
}

func (d *driver) cleanup(ctx context.Context) error {
	return d.delete(ctx, d.dataVolume)
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%d ms", d.Milliseconds())
}

// usage is a process tree's CPU time (user + system, the children's
// waited-for ones included) and the resident memory of its biggest member
// (the driver itself).
func usage(pid int) (time.Duration, int64) {
	var cpu time.Duration
	var rss int64
	tick := int64(100) // USER_HZ
	var walk func(pid int)
	walk = func(pid int) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		// fields after the command: state ppid ... utime(12) stime(13) cutime(14) cstime(15) ... rss(22)
		var n [4]int64
		for i := range n {
			n[i], _ = strconv.ParseInt(f[11+i], 10, 64)
		}
		cpu += time.Duration(n[0]+n[1]+n[2]+n[3]) * time.Second / time.Duration(tick)
		if r, _ := strconv.ParseInt(f[21], 10, 64); r*4096 > rss {
			rss = r * 4096
		}
		children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		for _, c := range strings.Fields(string(children)) {
			if cp, err := strconv.Atoi(c); err == nil {
				walk(cp)
			}
		}
	}
	walk(pid)
	return cpu, rss
}
