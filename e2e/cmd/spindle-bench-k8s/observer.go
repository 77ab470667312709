package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
)

// observer watches the benchmark's objects and notes, on this machine's
// clock, when it first saw each of them reach each state. Watching gives
// sub-second times; the objects' own timestamps have whole seconds.
type observer struct {
	ns   string
	stop func()

	mu          sync.Mutex
	claims      map[string]*claimTimes  // by PVC name
	pods        map[string]*podTimes    // by pod name
	volumes     map[string]*volumeTimes // by PV name, this namespace's only
	attachments map[string]*attachTimes // by PV name, every VolumeAttachment
}

type claimTimes struct{ created, bound, gone time.Time }

type podTimes struct {
	created, scheduled, running, gone time.Time
	ended                             string // a final phase and why, when it ended
}

type volumeTimes struct {
	claim         string
	handle        string // spec.csi.volumeHandle
	created, gone time.Time
}

type attachTimes struct {
	created, attached, gone time.Time
	attachError             string // the last status.attachError seen
}

// startObserver watches pods and PVCs in ns and every PV and
// VolumeAttachment, and returns once the watches are established.
func startObserver(ctx context.Context, client kubernetes.Interface, ns string) (*observer, error) {
	o := &observer{
		ns:     ns,
		claims: map[string]*claimTimes{}, pods: map[string]*podTimes{},
		volumes: map[string]*volumeTimes{}, attachments: map[string]*attachTimes{},
	}
	pods, claims := client.CoreV1().Pods(ns), client.CoreV1().PersistentVolumeClaims(ns)
	pvs, vas := client.CoreV1().PersistentVolumes(), client.StorageV1().VolumeAttachments()
	sources := []watchSource{
		{"pods", o.seePod, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return pods.List(ctx, opts)
		}, pods.Watch},
		{"PVCs", o.seeClaim, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return claims.List(ctx, opts)
		}, claims.Watch},
		{"PVs", o.seeVolume, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) { return pvs.List(ctx, opts) }, pvs.Watch},
		{"VolumeAttachments", o.seeAttachment, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) { return vas.List(ctx, opts) }, vas.Watch},
	}
	wctx, cancel := context.WithCancel(context.Background())
	o.stop = cancel
	for _, src := range sources {
		rv, err := src.list(ctx)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("list %s: %w", src.what, err)
		}
		go src.follow(wctx, rv)
	}
	return o, nil
}

func (o *observer) claimCreated(name string, t time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.claim(name)
	if c.created.IsZero() || t.Before(c.created) {
		c.created = t
	}
}

func (o *observer) podCreated(name string, t time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	p := o.pod(name)
	if p.created.IsZero() || t.Before(p.created) {
		p.created = t
	}
}

// claim and pod return the entry of name, made on first use; o.mu held.
func (o *observer) claim(name string) *claimTimes {
	if o.claims[name] == nil {
		o.claims[name] = &claimTimes{}
	}
	return o.claims[name]
}

func (o *observer) pod(name string) *podTimes {
	if o.pods[name] == nil {
		o.pods[name] = &podTimes{}
	}
	return o.pods[name]
}

// first sets *t to now unless it is set already.
func first(t *time.Time, now time.Time) {
	if t.IsZero() {
		*t = now
	}
}

func (o *observer) seePod(obj any, now time.Time, deleted bool) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	p := o.pod(pod.Name)
	first(&p.created, now) // the watch can be quicker than the create's answer
	if deleted {
		first(&p.gone, now)
		return
	}
	if pod.Spec.NodeName != "" {
		first(&p.scheduled, now)
	}
	switch pod.Status.Phase {
	case corev1.PodRunning:
		first(&p.running, now)
	case corev1.PodSucceeded, corev1.PodFailed:
		if p.ended == "" && pod.DeletionTimestamp == nil {
			p.ended = fmt.Sprintf("%s ended %s: %s", pod.Name, pod.Status.Phase, endReason(pod))
		}
	}
}

// endReason is what a pod's container said when it ended.
func endReason(pod *corev1.Pod) string {
	for _, s := range pod.Status.ContainerStatuses {
		if t := s.State.Terminated; t != nil {
			return strings.TrimSpace(fmt.Sprintf("%s (exit code %d) %s", t.Reason, t.ExitCode, t.Message))
		}
	}
	return strings.TrimSpace(pod.Status.Reason + " " + pod.Status.Message)
}

func (o *observer) seeClaim(obj any, now time.Time, deleted bool) {
	pvc, ok := obj.(*corev1.PersistentVolumeClaim)
	if !ok {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.claim(pvc.Name)
	first(&c.created, now)
	if deleted {
		first(&c.gone, now)
	} else if pvc.Status.Phase == corev1.ClaimBound {
		first(&c.bound, now)
	}
}

func (o *observer) seeVolume(obj any, now time.Time, deleted bool) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Namespace != o.ns {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	v := o.volumes[pv.Name]
	if v == nil {
		v = &volumeTimes{claim: pv.Spec.ClaimRef.Name, created: now}
		o.volumes[pv.Name] = v
	}
	if pv.Spec.CSI != nil {
		v.handle = pv.Spec.CSI.VolumeHandle
	}
	if deleted {
		first(&v.gone, now)
	}
}

func (o *observer) seeAttachment(obj any, now time.Time, deleted bool) {
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok || va.Spec.Source.PersistentVolumeName == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	pv := *va.Spec.Source.PersistentVolumeName
	a := o.attachments[pv]
	if a == nil || !a.gone.IsZero() && !deleted {
		a = &attachTimes{created: now} // the first, or a new one after the last went
		o.attachments[pv] = a
	}
	if deleted {
		first(&a.gone, now)
		return
	}
	if va.Status.Attached {
		first(&a.attached, now)
	}
	if e := va.Status.AttachError; e != nil {
		a.attachError = e.Message
	}
}

// progress is how far the apply or the delete got.
type progress struct {
	pods, claims, bound, scheduled, attached, running int
	podsGone, claimsGone, volumes, volumesGone        int
	attachments, attachmentsGone                      int
	failed                                            string // the first pod that ended, and why
}

func (p progress) String() string {
	return fmt.Sprintf("%d/%d PVCs Bound, %d pods scheduled, %d volumes attached, %d/%d pods Running",
		p.bound, p.claims, p.scheduled, p.attached, p.running, p.pods)
}

func (o *observer) progress() progress {
	o.mu.Lock()
	defer o.mu.Unlock()
	var p progress
	for _, c := range o.claims {
		p.claims++
		p.bound += count(!c.bound.IsZero())
		p.claimsGone += count(!c.gone.IsZero())
	}
	for _, pod := range o.pods {
		p.pods++
		p.scheduled += count(!pod.scheduled.IsZero())
		p.running += count(!pod.running.IsZero())
		p.podsGone += count(!pod.gone.IsZero())
		if pod.ended != "" && p.failed == "" {
			p.failed = pod.ended
		}
	}
	for name, v := range o.volumes {
		p.volumes++
		p.volumesGone += count(!v.gone.IsZero())
		if a := o.attachments[name]; a != nil {
			p.attachments++
			p.attached += count(!a.attached.IsZero())
			p.attachmentsGone += count(!a.gone.IsZero())
		}
	}
	return p
}

func count(b bool) int {
	if b {
		return 1
	}
	return 0
}

// volumeHandles are the CSI volume handles of the namespace's PVs.
func (o *observer) volumeHandles() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, v := range o.volumes {
		if v.handle != "" {
			out = append(out, v.handle)
		}
	}
	return out
}
