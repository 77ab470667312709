package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// apiTimeout bounds one API request; the cluster answers in milliseconds.
const apiTimeout = 30 * time.Second

// bench is one run against one cluster.
type bench struct {
	o      options
	client kubernetes.Interface
	obs    *observer
	pool   *pool // nil when the pool is not checked
}

func newBench(ctx context.Context, o options) (*bench, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s (is the cluster up? hack/local-cluster/up.sh): %w", o.kubeconfig, err)
	}
	// The benchmark's own requests must not be what serialises the apply:
	// client-go's default of 5 requests a second would take 40 s for 200
	// objects.
	cfg.QPS, cfg.Burst = 1000, 2000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	b := &bench{o: o, client: client}
	if b.pool, err = openPool(o.poolDir); err != nil {
		return nil, err
	}
	if err := b.createNamespace(ctx); err != nil {
		return nil, err
	}
	if b.obs, err = startObserver(ctx, client, o.namespace); err != nil {
		b.deleteNamespace(ctx)
		return nil, err
	}
	return b, nil
}

// close stops the watches and deletes the namespace (its objects are
// gone by then, or the run failed and the cluster is going down anyway).
func (b *bench) close() {
	b.obs.stop()
	b.deleteNamespace(context.Background())
}

// createNamespace makes a fresh namespace and waits for its default
// ServiceAccount, without which the apiserver refuses pods.
func (b *bench) createNamespace(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.o.namespace}}
	if _, err := b.client.CoreV1().Namespaces().Create(cctx, ns, metav1.CreateOptions{}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("namespace %s exists (left by an earlier run?): delete it, or pick another with -namespace", b.o.namespace)
		}
		return fmt.Errorf("create namespace %s: %w", b.o.namespace, err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := b.client.CoreV1().ServiceAccounts(b.o.namespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("namespace %s has no default ServiceAccount after a minute (is kube-controller-manager running?)", b.o.namespace)
	}
	return nil
}

// deleteNamespace deletes the namespace and waits until it is gone, so
// that the next run can make it again.
func (b *bench) deleteNamespace(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	err := b.client.CoreV1().Namespaces().Delete(cctx, b.o.namespace, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		fmt.Fprintf(os.Stderr, "spindle-bench-k8s: delete namespace %s: %v\n", b.o.namespace, err)
		return
	}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := b.client.CoreV1().Namespaces().Get(ctx, b.o.namespace, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "spindle-bench-k8s: namespace %s is still there two minutes after its delete\n", b.o.namespace)
	}
}

// names are the PVCs' and pods' names, in order.
func (b *bench) names() []string {
	out := make([]string, b.o.pods)
	for i := range out {
		out[i] = fmt.Sprintf("bench-%03d", i)
	}
	return out
}

// applyPhase creates every PVC and pod, waits until the pods are Running
// and prints what it measured.
func (b *bench) applyPhase(ctx context.Context) error {
	before := scrapeAll(ctx, b.o.metricsURLs)
	for _, s := range before.skipped {
		fmt.Fprintf(os.Stderr, "spindle-bench-k8s: no driver metrics from %s; skipped\n", s)
	}
	start := time.Now()
	if err := b.apply(ctx); err != nil {
		return err
	}
	if b.o.volumes {
		fmt.Printf("Apply: %d PVCs and %d pods created in %s\n", b.o.pods, b.o.pods, seconds(time.Since(start)))
	} else {
		fmt.Printf("Apply: %d pods created in %s\n", b.o.pods, seconds(time.Since(start)))
	}

	waitErr := b.waitRunning(ctx, start)
	after := scrapeAll(ctx, b.o.metricsURLs)
	b.printApply(start)
	delta := after.minus(before)
	if b.o.volumes { // the baseline's pods cause no driver call
		printRPCs("Driver RPCs during the apply", delta.series, applyMethods)
		printCommands("Driver commands during the apply", delta.commands)
	}
	b.printWarnings(ctx)
	if waitErr != nil {
		b.explainStuckPods(ctx)
	}
	return waitErr
}

// apply creates claim i, then pod i, for every i, with o.parallel
// requests in flight: the cluster sees them all at once.
func (b *bench) apply(ctx context.Context) error {
	return b.eachName(func(name string) error { return b.createPair(ctx, name) })
}

// eachName calls fn for every name with o.parallel calls in flight and
// returns every error.
func (b *bench) eachName(fn func(name string) error) error {
	names := b.names()
	errs := make([]error, len(names))
	sem := make(chan struct{}, b.o.parallel)
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = fn(name)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (b *bench) createPair(ctx context.Context, name string) error {
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	if b.o.volumes {
		if _, err := b.client.CoreV1().PersistentVolumeClaims(b.o.namespace).Create(cctx, b.claim(name), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create PVC %s: %w", name, err)
		}
		b.obs.claimCreated(name, time.Now())
	}
	if _, err := b.client.CoreV1().Pods(b.o.namespace).Create(cctx, b.pod(name), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", name, err)
	}
	b.obs.podCreated(name, time.Now())
	return nil
}

// waitRunning waits until every pod is Running, printing progress to
// stderr; a pod that ends instead, or the timeout, fails the run.
func (b *bench) waitRunning(ctx context.Context, start time.Time) error {
	deadline := start.Add(b.o.timeout)
	lastProgress := time.Now()
	for {
		p := b.obs.progress()
		if p.failed != "" {
			return fmt.Errorf("pod %s", p.failed)
		}
		if p.running == b.o.pods {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d pods not Running %s after the apply (-timeout)", b.o.pods-p.running, b.o.pods, b.o.timeout)
		}
		if time.Since(lastProgress) >= 5*time.Second {
			fmt.Fprintf(os.Stderr, "  %5s: %s\n", seconds(time.Since(start)), p)
			lastProgress = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
