// Command spindle-demo is Spindle's main job in one command (`make demo`):
// it starts the driver binary on the embedded loop backend, takes one volume
// through the whole lifecycle over the driver's socket exactly as Kubernetes
// would, prints every step with its duration, and checks that nothing is
// left behind.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "spindle-demo: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	binary := flag.String("driver", "bin/spindle", "the spindle binary to run")
	fsType := flag.String("fs", "ext4", "filesystem of the volume: ext4, xfs, btrfs, or block for a raw block volume")
	sizeMiB := flag.Int64("size-mib", 1024, "volume size in MiB")
	keep := flag.Bool("keep", false, "keep the work directory (driver log, pool) afterwards")
	flag.Parse()

	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root: the driver binds loop devices and mounts filesystems (run `sudo make demo`)")
	}
	work, err := os.MkdirTemp("", "spindle-demo-")
	if err != nil {
		return err
	}
	keepWork := *keep
	defer func() {
		if !keepWork {
			os.RemoveAll(work)
		}
	}()

	fmt.Printf("Starting %s (mode=all, loop backend, pool %s/pool)\n", *binary, work)
	start := time.Now()
	drv, err := harness.StartProcess(harness.ProcessOptions{Binary: *binary, WorkDir: work, LogLevel: os.Getenv("SPINDLE_DEMO_LOG_LEVEL")})
	if err != nil {
		return err
	}
	ctx := context.Background()
	info, err := drv.Identity.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		_ = drv.Stop()
		return err
	}
	fmt.Printf("Driver %s %s serving on %s (ready in %s)\n\n", info.GetName(), info.GetVendorVersion(), drv.Socket, ms(time.Since(start)))

	capability := lifecycle.MountCapability(*fsType)
	if *fsType == "block" {
		capability = lifecycle.BlockCapability()
	}
	step := 0
	c := lifecycle.NewClient(drv, func(name, volumeID string, elapsed time.Duration, err error) {
		step++
		result := "ok"
		if err != nil {
			result = "FAILED: " + err.Error()
		}
		fmt.Printf("%3d. %-27s %-44s %9s  %s\n", step, name, volumeID, ms(elapsed), result)
	})
	total := time.Now()
	runErr := c.Full(ctx, lifecycle.Spec{
		Name:       fmt.Sprintf("pvc-demo-%d", time.Now().Unix()),
		SizeBytes:  *sizeMiB << 20,
		Capability: capability,
		WorkDir:    work,
	})
	fmt.Printf("\nWhole lifecycle: %s\n", ms(time.Since(total)))

	rss, rssErr := drv.RSSBytes()
	leftovers := leaks(drv.PoolDir, work)
	stopErr := drv.Stop()
	if runErr != nil {
		keepWork = true
		return fmt.Errorf("%w (driver log kept: %s/spindle.log)", runErr, work)
	}
	if rssErr == nil {
		fmt.Printf("Driver RSS: %.1f MiB\n", float64(rss)/(1<<20))
	}
	if len(leftovers) > 0 {
		return fmt.Errorf("left behind: %s", strings.Join(leftovers, "; "))
	}
	fmt.Println("Left behind: no loop device, no mount, no image.")
	return stopErr
}

// leaks lists loop devices, mounts and images the lifecycle left.
func leaks(poolDir, work string) []string {
	var out []string
	for _, d := range harness.LoopDevicesUnder(poolDir) {
		out = append(out, "loop device "+d)
	}
	for _, m := range harness.MountsUnder(work) {
		out = append(out, "mount "+m)
	}
	entries, _ := os.ReadDir(poolDir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".img") {
			out = append(out, "image "+e.Name())
		}
	}
	return out
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }
