// Command spindle-bench measures the driver against the plain commands that
// do the same work (`make bench`). It runs the driver binary on a loop pool
// and prints:
//
//   - N sequential lifecycles (create → controller publish → stage → publish
//     → unpublish → unstage → controller unpublish → delete) interleaved with
//     the same steps as plain commands (truncate, losetup, mkfs, mount, bind,
//     umount, losetup -d, rm), and the ratio driver/plain;
//   - a parallel batch of lifecycles;
//   - per-RPC p50/p99;
//   - the same sequential lifecycles again with many volumes already staged,
//     to show whether per-lifecycle time grows with the node's load;
//   - the driver's resident memory when idle.
//
// It prints figures; it asserts nothing about time.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
)

type options struct {
	binary    string
	n         int
	parallel  int
	staged    int
	sizeMiB   int64
	stagedMiB int64
	logLevel  string
	keep      bool
	parent    string
}

func main() {
	var o options
	flag.StringVar(&o.binary, "driver", "bin/spindle", "the spindle binary to run")
	flag.IntVar(&o.n, "n", 20, "sequential lifecycles (and as many plain-command runs)")
	flag.IntVar(&o.parallel, "parallel", 8, "lifecycles in the parallel batch")
	flag.IntVar(&o.staged, "staged", 200, "volumes kept staged for the under-load run")
	flag.Int64Var(&o.sizeMiB, "size-mib", 1024, "size of each measured volume (ext4)")
	flag.Int64Var(&o.stagedMiB, "staged-size-mib", 16, "size of each background volume")
	flag.StringVar(&o.logLevel, "log-level", "warn", "driver log level (debug logs every command with its duration)")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (driver log) afterwards")
	flag.StringVar(&o.parent, "dir", os.TempDir(), "where the work directory (pool, staging and target paths) is made; its filesystem is the pool's")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "spindle-bench: %v\n", err)
		os.Exit(1)
	}
}

// recorder collects durations per step; safe for concurrent use.
type recorder struct {
	mu    sync.Mutex
	steps map[string][]time.Duration
}

func newRecorder() *recorder { return &recorder{steps: map[string][]time.Duration{}} }

func (r *recorder) observe(step, _ string, d time.Duration, err error) {
	if err != nil {
		return
	}
	r.mu.Lock()
	r.steps[step] = append(r.steps[step], d)
	r.mu.Unlock()
}

// bench is one run: the driver, its work directory and what the phases
// measured.
type bench struct {
	o                    options
	ctx                  context.Context
	drv                  *harness.Driver
	work                 string
	size                 int64
	rpcs, plainSteps     *recorder
	driverRuns, plainRun []time.Duration
}

func run(o options) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: binds loop devices and mounts filesystems (run `sudo make bench`)")
	}
	work, err := os.MkdirTemp(o.parent, "spindle-bench-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Printf("Work directory (kept): %s\n", work)
	} else {
		defer os.RemoveAll(work)
	}
	drv, err := harness.StartProcess(harness.ProcessOptions{Binary: o.binary, WorkDir: work, LogLevel: o.logLevel})
	if err != nil {
		return err
	}
	defer func() {
		if err := drv.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "spindle-bench: stop driver: %v\n", err)
		}
	}()
	time.Sleep(200 * time.Millisecond) // let start-up allocations settle before the idle reading
	idleRSS, _ := drv.RSSBytes()

	b := &bench{o: o, ctx: context.Background(), drv: drv, work: work, size: o.sizeMiB << 20, rpcs: newRecorder(), plainSteps: newRecorder()}
	fmt.Printf("Spindle benchmark: %d MiB ext4 volumes, loop backend, pool on %s\n\n", o.sizeMiB, work)
	if err := b.sequential(); err != nil {
		return err
	}
	if err := b.parallelBatch(); err != nil {
		return err
	}
	if o.staged > 0 {
		if err := b.underLoad(); err != nil {
			return err
		}
	}
	fmt.Printf("\nDriver RSS idle after start: %.1f MiB\n", mib(idleRSS))
	return nil
}

// pairs runs n lifecycles through the driver, each followed by the same
// steps as plain commands, so both sides see the same machine state.
func (b *bench) pairs(c *lifecycle.Client, prefix, dir string, plainSteps *recorder) (driverRuns, plainRuns []time.Duration, err error) {
	for i := 0; i < b.o.n; i++ {
		d, err := oneLifecycle(b.ctx, c, fmt.Sprintf("%s-%d", prefix, i), b.size, filepath.Join(b.work, dir))
		if err != nil {
			return nil, nil, err
		}
		driverRuns = append(driverRuns, d)
		p, err := plainLifecycle(b.ctx, filepath.Join(b.work, "plain"), b.size, plainSteps)
		if err != nil {
			return nil, nil, fmt.Errorf("plain commands: %w", err)
		}
		plainRuns = append(plainRuns, p)
	}
	return driverRuns, plainRuns, nil
}

// sequential: lifecycles one after the other, against plain commands.
func (b *bench) sequential() error {
	// One untimed pair first, so neither side pays for cold caches (the
	// page cache of the programs, the first gRPC connection).
	if _, err := oneLifecycle(b.ctx, lifecycle.NewClient(b.drv, nil), "bench-warmup", b.size, filepath.Join(b.work, "seq")); err != nil {
		return err
	}
	if _, err := plainLifecycle(b.ctx, filepath.Join(b.work, "plain"), b.size, newRecorder()); err != nil {
		return fmt.Errorf("plain commands: %w", err)
	}
	var err error
	b.driverRuns, b.plainRun, err = b.pairs(lifecycle.NewClient(b.drv, b.rpcs.observe), "bench-seq", "seq", b.plainSteps)
	if err != nil {
		return err
	}
	fmt.Printf("Sequential lifecycles (N=%d):\n", b.o.n)
	fmt.Printf("  driver over gRPC   p50 %8s  p99 %8s  first %8s\n", ms(pct(b.driverRuns, 50)), ms(pct(b.driverRuns, 99)), ms(b.driverRuns[0]))
	fmt.Printf("  plain commands     p50 %8s  p99 %8s  first %8s\n", ms(pct(b.plainRun, 50)), ms(pct(b.plainRun, 99)), ms(b.plainRun[0]))
	// Each driver run is paired with the plain run right after it, so a
	// pair sees the same machine; the median pair ratio resists the noise
	// of a shared VM's disk better than a ratio of medians.
	pairs := pairRatios(b.driverRuns, b.plainRun)
	fmt.Printf("  ratio driver/plain: first pair (N=1) %.2f; over N=%d pairs p25 %.2f, median %.2f, p75 %.2f\n\n",
		pairs[0], b.o.n, fpct(pairs, 25), fpct(pairs, 50), fpct(pairs, 75))
	return nil
}

// parallelBatch: lifecycles at once, then the per-RPC figures of all runs.
func (b *bench) parallelBatch() error {
	c := lifecycle.NewClient(b.drv, b.rpcs.observe)
	start := time.Now()
	errs := make([]error, b.o.parallel)
	var wg sync.WaitGroup
	for i := 0; i < b.o.parallel; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, errs[i] = oneLifecycle(b.ctx, c, fmt.Sprintf("bench-par-%d", i), b.size, filepath.Join(b.work, "par", fmt.Sprint(i)))
		}(i)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	batch := time.Since(start)
	fmt.Printf("Parallel batch: %d lifecycles in %s (%.1f lifecycles/s)\n\n", b.o.parallel, ms(batch), float64(b.o.parallel)/batch.Seconds())
	fmt.Println("Per RPC (sequential and parallel runs):")
	printSteps(b.rpcs, []string{lifecycle.StepCreate, lifecycle.StepControllerPublish, lifecycle.StepStage, lifecycle.StepPublish,
		lifecycle.StepUnpublish, lifecycle.StepUnstage, lifecycle.StepControllerUnpublish, lifecycle.StepDelete})
	fmt.Println("\nPlain commands, per step:")
	printSteps(b.plainSteps, plainOrder)
	return nil
}

// underLoad: the same sequential lifecycles with many volumes staged.
func (b *bench) underLoad() error {
	fmt.Printf("\nStaging %d background volumes (%d MiB each)...\n", b.o.staged, b.o.stagedMiB)
	background, stageErr := stageMany(b.ctx, lifecycle.NewClient(b.drv, nil), b.o.staged, b.o.stagedMiB<<20, filepath.Join(b.work, "bg"))
	defer cleanupMany(b.ctx, lifecycle.NewClient(b.drv, nil), background)
	if stageErr != nil {
		return stageErr
	}
	loaded, plainLoaded, err := b.pairs(lifecycle.NewClient(b.drv, nil), "bench-load", "load", newRecorder())
	if err != nil {
		return err
	}
	fmt.Printf("Sequential lifecycles with %d volumes staged (N=%d):\n", b.o.staged, b.o.n)
	fmt.Printf("  driver over gRPC   p50 %8s  p99 %8s\n", ms(pct(loaded, 50)), ms(pct(loaded, 99)))
	fmt.Printf("  plain commands     p50 %8s  p99 %8s\n", ms(pct(plainLoaded, 50)), ms(pct(plainLoaded, 99)))
	fmt.Printf("  growth of p50 against the idle node: driver %.2fx, plain commands %.2fx\n",
		ratio(pct(loaded, 50), pct(b.driverRuns, 50)), ratio(pct(plainLoaded, 50), pct(b.plainRun, 50)))
	idleRatio, loadRatio := fpct(pairRatios(b.driverRuns, b.plainRun), 50), fpct(pairRatios(loaded, plainLoaded), 50)
	fmt.Printf("  ratio driver/plain under load: median pair %.2f (%.2fx the idle node's %.2f)\n", loadRatio, loadRatio/idleRatio, idleRatio)
	loadedRSS, _ := b.drv.RSSBytes()
	fmt.Printf("  driver RSS with %d volumes staged: %.1f MiB\n", b.o.staged, mib(loadedRSS))
	return nil
}

// oneLifecycle runs the pod-free lifecycle plus one publish, and returns its duration.
func oneLifecycle(ctx context.Context, c *lifecycle.Client, name string, size int64, dir string) (time.Duration, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return 0, err
	}
	target := filepath.Join(dir, "target-"+name)
	start := time.Now()
	v, err := c.Create(ctx, name, size, lifecycle.MountCapability("ext4"), nil, filepath.Join(dir, "staging-"+name))
	if err != nil {
		return 0, err
	}
	if err := c.Attach(ctx, v); err != nil {
		return 0, err
	}
	if err := c.Publish(ctx, v, target, false); err != nil {
		return 0, err
	}
	if err := c.Unpublish(ctx, v, target); err != nil {
		return 0, err
	}
	if err := c.Detach(ctx, v); err != nil {
		return 0, err
	}
	if err := c.Delete(ctx, v); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

var plainOrder = []string{"truncate", "losetup", "mkfs.ext4", "mount", "mount --bind", "umount (bind)", "umount", "losetup -d", "rm"}

// plainLifecycle does by hand what one lifecycle does: the same flags the
// driver uses for losetup and mkfs, so the comparison is like for like.
func plainLifecycle(ctx context.Context, dir string, size int64, rec *recorder) (time.Duration, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return 0, err
	}
	img, staging, target := filepath.Join(dir, "plain.img"), filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	for _, d := range []string{staging, target} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return 0, err
		}
	}
	var dev string
	steps := []struct {
		name string
		args func() []string
	}{
		{"truncate", func() []string { return []string{"truncate", "-s", fmt.Sprint(size), img} }},
		{"losetup", func() []string {
			return []string{"losetup", "--find", "--show", "--direct-io=on", "--sector-size", "4096", img}
		}},
		{"mkfs.ext4", func() []string {
			return []string{"mkfs.ext4", "-q", "-b", "4096", "-m", "0", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1", dev}
		}},
		{"mount", func() []string { return []string{"mount", "-t", "ext4", dev, staging} }},
		{"mount --bind", func() []string { return []string{"mount", "--bind", staging, target} }},
		{"umount (bind)", func() []string { return []string{"umount", target} }},
		{"umount", func() []string { return []string{"umount", staging} }},
		{"losetup -d", func() []string { return []string{"losetup", "--detach", dev} }},
		{"rm", func() []string { return []string{"rm", "-f", img} }},
	}
	start := time.Now()
	for _, s := range steps {
		args := s.args()
		t := time.Now()
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "LC_ALL=C")
		out, err := cmd.Output()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", strings.Join(args, " "), err)
		}
		rec.observe(s.name, "", time.Since(t), nil)
		if s.name == "losetup" {
			dev = strings.TrimSpace(string(out))
		}
	}
	return time.Since(start), nil
}

// stageMany creates and stages n small volumes; it returns those it made
// so they can be cleaned up even when it fails part-way.
func stageMany(ctx context.Context, c *lifecycle.Client, n int, size int64, dir string) ([]*lifecycle.Volume, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	var vols []*lifecycle.Volume
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("bench-bg-%d", i)
		v, err := c.Create(ctx, name, size, lifecycle.MountCapability("ext4"), nil, filepath.Join(dir, name))
		if err != nil {
			return vols, err
		}
		vols = append(vols, v)
		if err := c.Attach(ctx, v); err != nil {
			return vols, err
		}
	}
	return vols, nil
}

func cleanupMany(ctx context.Context, c *lifecycle.Client, vols []*lifecycle.Volume) {
	for _, v := range vols {
		err := errors.Join(c.Detach(ctx, v), c.Delete(ctx, v))
		if err != nil {
			fmt.Fprintf(os.Stderr, "spindle-bench: cleanup %s: %v\n", v.ID, err)
		}
	}
}

func printSteps(r *recorder, order []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Printf("  %-27s %6s %9s %9s\n", "step", "count", "p50", "p99")
	for _, name := range order {
		ds := r.steps[name]
		if len(ds) == 0 {
			continue
		}
		fmt.Printf("  %-27s %6d %9s %9s\n", name, len(ds), ms(pct(ds, 50)), ms(pct(ds, 99)))
	}
}

// pct is the p-th percentile (nearest rank).
func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := (p*len(s) + 99) / 100
	if rank < 1 {
		rank = 1
	}
	return s[rank-1]
}

// pairRatios divides each driver run by the plain run paired with it.
func pairRatios(driver, plain []time.Duration) []float64 {
	out := make([]float64, len(driver))
	for i := range driver {
		out[i] = ratio(driver[i], plain[i])
	}
	return out
}

// fpct is the p-th percentile (nearest rank) of xs.
func fpct(xs []float64, p int) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := (p*len(s) + 99) / 100
	if rank < 1 {
		rank = 1
	}
	return s[rank-1]
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }
func mib(b int64) float64              { return float64(b) / (1 << 20) }
func ms(d time.Duration) string        { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }
