// Command spindle-bench-k8s measures Spindle at scale on a running
// Kubernetes (`make bench-k8s`, on the local cluster of hack/local-cluster).
// It applies N PVCs and N pods, each pod mounting its own claim, all at
// once, and prints:
//
//   - the time from the apply until every pod is Running, and when the
//     first, a quarter, half and three quarters of them were;
//   - per pod, from what it watched through the API: PVC created → Bound,
//     pod created → scheduled, VolumeAttachment created → attached,
//     attached → pod Running, pod created → Running (p50, p99, max);
//   - the driver's latency of each RPC the apply caused, from its
//     spindle_rpc_duration_seconds histograms (p50/p99 estimated as
//     Prometheus's histogram_quantile does), and the RPCs that failed;
//   - the namespace's Warning events, by reason;
//   - the time from deleting every pod and claim at once until the pods,
//     claims, VolumeAttachments and PVs are gone and the loop pool holds
//     none of their images and no loop device bound to one.
//
// It prints figures and asserts nothing about time. It fails only when
// something does not work: a pod that is not Running within -timeout (it
// then prints what that pod waits for and its events), or objects or
// images still there -timeout after the delete.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

type options struct {
	clusterDir   string
	kubeconfig   string
	poolDir      string
	namespace    string
	pods         int
	size         resource.Quantity
	storageClass string
	image        string
	hostNetwork  bool
	volumes      bool
	metricsURLs  []string
	parallel     int
	timeout      time.Duration
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "spindle-bench-k8s:", err)
		os.Exit(2)
	}
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "spindle-bench-k8s: FAILED:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("spindle-bench-k8s", flag.ContinueOnError)
	defaultDir := os.Getenv("CLUSTER_DIR")
	if defaultDir == "" {
		defaultDir = "/var/tmp/spindle-local-cluster"
	}
	size := fs.String("size", "64Mi", "size of each PVC")
	metrics := fs.String("metrics", "http://127.0.0.1:9810/metrics,http://127.0.0.1:9808/metrics",
		"the driver's /metrics endpoints, comma-separated: the controller's and the node plugin's (the chart's ports on a hostNetwork cluster); one that does not answer is skipped, saying so")
	fs.StringVar(&o.clusterDir, "cluster-dir", defaultDir, "CLUSTER_DIR of hack/local-cluster: admin.kubeconfig and the loop pool")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig (default <cluster-dir>/admin.kubeconfig)")
	fs.StringVar(&o.poolDir, "pool-dir", "", "the loop pool, checked for leftover images and loop devices (default <cluster-dir>/pool; \"none\" skips the check)")
	fs.StringVar(&o.namespace, "namespace", "spindle-bench", "namespace to create for the PVCs and pods (must not exist)")
	fs.IntVar(&o.pods, "pods", 100, "pods, each with its own PVC (kubelet runs at most 110 pods per node, the driver's own included)")
	fs.StringVar(&o.storageClass, "storage-class", "spindle-ext4", "StorageClass of the PVCs")
	fs.StringVar(&o.image, "image", "local.test/spindle-e2e-pod:1", "the pods' image (pulled Never), run with the argument pause")
	fs.BoolVar(&o.volumes, "volumes", true, "give each pod its own PVC; -volumes=false runs the same pods without volumes: what the cluster itself takes to run them, the baseline of the figures with volumes")
	fs.BoolVar(&o.hostNetwork, "host-network", false, "run the pods in the host's network, as e2e/kubernetes does (no pod network set-up per pod)")
	fs.IntVar(&o.parallel, "parallel", 50, "API requests in flight while applying and deleting")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Minute, "how long the pods may take to be Running, and everything to be gone after the delete, before the run fails")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	q, err := resource.ParseQuantity(*size)
	if err != nil {
		return o, fmt.Errorf("-size %q: %w", *size, err)
	}
	o.size = q
	if o.kubeconfig == "" {
		o.kubeconfig = filepath.Join(o.clusterDir, "admin.kubeconfig")
	}
	if o.poolDir == "" {
		o.poolDir = filepath.Join(o.clusterDir, "pool")
	}
	for _, u := range strings.Split(*metrics, ",") {
		if u = strings.TrimSpace(u); u != "" {
			o.metricsURLs = append(o.metricsURLs, u)
		}
	}
	if o.pods < 1 || o.parallel < 1 {
		return o, errors.New("-pods and -parallel must be at least 1")
	}
	return o, nil
}

// run is the whole benchmark: apply, wait for Running, report, delete,
// wait for nothing to be left, report. The namespace is deleted at the end
// whatever happened.
func run(ctx context.Context, o options) error {
	b, err := newBench(ctx, o)
	if err != nil {
		return err
	}
	defer b.close()
	if o.volumes {
		fmt.Printf("spindle-bench-k8s: %d pods, each mounting its own %s PVC of StorageClass %s (namespace %s, %s)\n\n",
			o.pods, o.size.String(), o.storageClass, o.namespace, networkName(o.hostNetwork))
	} else {
		fmt.Printf("spindle-bench-k8s: %d pods without volumes, the baseline (namespace %s, %s)\n\n",
			o.pods, o.namespace, networkName(o.hostNetwork))
	}

	applyErr := b.applyPhase(ctx)
	if applyErr != nil {
		fmt.Println()
		fmt.Println("The apply failed; deleting what it made:")
	}
	deleteErr := b.deletePhase(ctx)
	return errors.Join(applyErr, deleteErr)
}

func networkName(host bool) string {
	if host {
		return "hostNetwork pods"
	}
	return "pods on the pod network"
}
