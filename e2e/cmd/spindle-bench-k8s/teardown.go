package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// deletePhase deletes every pod and claim at once, each with its own
// request as `kubectl delete -f` of the applied manifest does (the
// apiserver's DeleteCollection deletes one object after the other), and
// waits until the pods, claims, VolumeAttachments and PVs are gone and no
// image of theirs or loop device is left in the pool.
func (b *bench) deletePhase(ctx context.Context) error {
	before := scrapeAll(ctx, b.o.metricsURLs)
	start := time.Now()
	if err := b.deleteAll(ctx); err != nil {
		return err
	}
	fmt.Println()
	fmt.Printf("Delete: every pod and PVC deleted at once (the requests took %s)\n", seconds(time.Since(start)))
	m, err := b.waitGone(ctx, start)
	for _, line := range m.lines() {
		fmt.Println(line)
	}
	after := scrapeAll(ctx, b.o.metricsURLs)
	delta := after.minus(before)
	if b.o.volumes { // the baseline's pods cause no driver call
		printRPCs("Driver RPCs during the delete", delta.series, deleteMethods)
		printCommands("Driver commands during the delete", delta.commands)
	}
	return err
}

// deleteAll deletes pod i, then claim i, for every i, with o.parallel
// requests in flight; what is already gone is no error.
func (b *bench) deleteAll(ctx context.Context) error {
	return b.eachName(func(name string) error {
		cctx, cancel := context.WithTimeout(ctx, apiTimeout)
		defer cancel()
		err := b.client.CoreV1().Pods(b.o.namespace).Delete(cctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pod %s: %w", name, err)
		}
		err = b.client.CoreV1().PersistentVolumeClaims(b.o.namespace).Delete(cctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete PVC %s: %w", name, err)
		}
		return nil
	})
}

// milestones are when each kind of object was all gone, after the delete.
type milestones struct {
	pods, claims, attachments, volumes, images time.Duration
	poolChecked                                bool
	withVolumes                                bool // false for the baseline: only pods
}

func (m milestones) lines() []string {
	at := func(d time.Duration) string {
		if d == 0 {
			return "not yet"
		}
		return "after " + seconds(d)
	}
	out := []string{"  pods gone                    " + at(m.pods)}
	if m.withVolumes {
		out = append(out,
			"  PVCs gone                    "+at(m.claims),
			"  VolumeAttachments gone       "+at(m.attachments),
			"  PVs gone                     "+at(m.volumes))
		if m.poolChecked {
			out = append(out, "  images and loop devices gone "+at(m.images))
		}
	}
	all := max(m.pods, m.claims, m.attachments, m.volumes, m.images)
	if m.pods > 0 && m.claims > 0 && m.attachments > 0 && m.volumes > 0 && (m.images > 0 || !m.poolChecked) {
		out = append(out, "All deleted after "+seconds(all))
	}
	return out
}

// waitGone polls the watched state and the pool until nothing is left.
func (b *bench) waitGone(ctx context.Context, start time.Time) (milestones, error) {
	var m milestones
	handles := b.obs.volumeHandles()
	m.poolChecked = b.pool != nil
	m.withVolumes = b.o.volumes
	deadline := start.Add(b.o.timeout)
	var left []string
	for {
		p := b.obs.progress()
		now := time.Since(start)
		mark := func(d *time.Duration, done bool) {
			if done && *d == 0 {
				*d = now
			}
		}
		mark(&m.pods, p.podsGone == p.pods)
		mark(&m.claims, p.claimsGone == p.claims)
		mark(&m.attachments, p.attachmentsGone == p.attachments)
		mark(&m.volumes, p.volumesGone == p.volumes)
		if m.poolChecked {
			var err error
			if left, err = b.pool.leftovers(handles); err != nil {
				return m, fmt.Errorf("read the pool %s: %w", b.pool.dir, err)
			}
			mark(&m.images, len(left) == 0)
		}
		if m.pods > 0 && m.claims > 0 && m.attachments > 0 && m.volumes > 0 && (m.images > 0 || !m.poolChecked) {
			return m, nil
		}
		if time.Now().After(deadline) {
			return m, fmt.Errorf("%s after the delete (-timeout), still there: %d pods, %d PVCs, %d VolumeAttachments, %d PVs; in the pool: %s",
				b.o.timeout, p.pods-p.podsGone, p.claims-p.claimsGone, p.attachments-p.attachmentsGone, p.volumes-p.volumesGone, strings.Join(first10(left), ", "))
		}
		select {
		case <-ctx.Done():
			return m, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func first10(s []string) []string {
	if len(s) > 10 {
		return append(s[:10:10], fmt.Sprintf("and %d more", len(s)-10))
	}
	return s
}

// explainStuckPods says, for the pods that are not Running, what they wait
// for: their state, their PVC's, and the events of both (and of the
// VolumeAttachment's error, if any); in full for the first few, counted
// for the rest.
func (b *bench) explainStuckPods(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	pods, err := b.client.CoreV1().Pods(b.o.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Printf("cannot list the pods to say why: %v\n", err)
		return
	}
	byState := map[string]int{}
	shown := 0
	fmt.Println()
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Status.Phase == corev1.PodRunning {
			continue
		}
		state := podState(pod)
		byState[state]++
		if shown < 5 {
			shown++
			fmt.Printf("Pod %s is %s:\n", pod.Name, state)
			b.printEvents(ctx, "Pod", pod.Name)
			b.printEvents(ctx, "PersistentVolumeClaim", pod.Name)
			b.printAttachError(pod.Name)
		}
	}
	fmt.Print("Pods not Running, by state:")
	for state, n := range byState {
		fmt.Printf(" %d %s;", n, state)
	}
	fmt.Println()
}

// podState is what kubectl's STATUS column would say, roughly.
func podState(pod *corev1.Pod) string {
	if pod.Spec.NodeName == "" {
		return string(pod.Status.Phase) + ", not scheduled"
	}
	for _, s := range pod.Status.ContainerStatuses {
		if w := s.State.Waiting; w != nil {
			return string(pod.Status.Phase) + ", " + w.Reason
		}
		if t := s.State.Terminated; t != nil {
			return string(pod.Status.Phase) + ", " + t.Reason
		}
	}
	return string(pod.Status.Phase) + ", on " + pod.Spec.NodeName + ", waiting for its volume"
}

func (b *bench) printEvents(ctx context.Context, kind, name string) {
	events, err := b.client.CoreV1().Events(b.o.namespace).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=" + kind + ",involvedObject.name=" + name,
	})
	if err != nil {
		fmt.Printf("  (cannot list the events of %s %s: %v)\n", kind, name, err)
		return
	}
	for _, e := range events.Items {
		fmt.Printf("  %s %s %s (x%d): %s\n", kind, e.Type, e.Reason, max(e.Count, 1), strings.TrimSpace(e.Message))
	}
}

func (b *bench) printAttachError(claim string) {
	o := b.obs
	o.mu.Lock()
	defer o.mu.Unlock()
	for pv, v := range o.volumes {
		if v.claim != claim {
			continue
		}
		if a := o.attachments[pv]; a != nil && a.attachError != "" && a.attached.IsZero() {
			fmt.Fprintf(os.Stdout, "  VolumeAttachment of %s: attachError: %s\n", pv, a.attachError)
		}
	}
}
