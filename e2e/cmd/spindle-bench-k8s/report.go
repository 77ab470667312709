package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// seconds prints a duration as seconds with one decimal, the resolution
// that matters for a run of tens of seconds.
func seconds(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

// millis prints a latency: milliseconds below ten seconds, else seconds.
func millis(d time.Duration) string {
	if d >= 10*time.Second {
		return seconds(d)
	}
	return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
}

// durations collects one latency per pod; pairs with a missing end are
// counted as missing rather than guessed.
type durations struct {
	values  []time.Duration
	missing int
}

func (d *durations) add(from, to time.Time) {
	if from.IsZero() || to.IsZero() {
		d.missing++
		return
	}
	d.values = append(d.values, max(to.Sub(from), 0))
}

// quantile is the nearest-rank quantile q of the values.
func (d *durations) quantile(q float64) time.Duration {
	if len(d.values) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(d.values))
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func (d *durations) row(name string) string {
	if len(d.values) == 0 {
		return fmt.Sprintf("  %-38s %9s %9s %9s  (none seen)", name, "-", "-", "-")
	}
	line := fmt.Sprintf("  %-38s %9s %9s %9s", name, millis(d.quantile(.5)), millis(d.quantile(.99)), millis(d.quantile(1)))
	if d.missing > 0 {
		line += fmt.Sprintf("  (%d not seen)", d.missing)
	}
	return line
}

// printApply prints when the pods were Running and, per pod, how long each
// step took as the API showed it.
func (b *bench) printApply(start time.Time) {
	o := b.obs
	o.mu.Lock()
	defer o.mu.Unlock()
	var running durations
	for _, p := range o.pods {
		running.add(start, p.running)
	}
	if len(running.values) == len(o.pods) {
		fmt.Printf("All %d pods Running after %s\n", len(o.pods), seconds(running.quantile(1)))
	} else {
		fmt.Printf("%d of %d pods Running, the last after %s\n", len(running.values), len(o.pods), seconds(running.quantile(1)))
	}
	fmt.Printf("  first Running after %s; 25%% after %s, 50%% after %s, 75%% after %s\n",
		seconds(running.quantile(0)), seconds(running.quantile(.25)), seconds(running.quantile(.5)), seconds(running.quantile(.75)))

	var bound, provisioned, scheduled, attach, attachedToRunning, scheduledToRunning, createdToRunning durations
	volumeOf := map[string]string{} // claim → PV
	for pv, v := range o.volumes {
		volumeOf[v.claim] = pv
		provisioned.add(o.claims[v.claim].created, v.created)
	}
	for name, c := range o.claims {
		bound.add(c.created, c.bound)
		p := o.pod(name)
		scheduled.add(p.created, p.scheduled)
		scheduledToRunning.add(p.scheduled, p.running)
		createdToRunning.add(p.created, p.running)
		a := o.attachments[volumeOf[name]]
		if a == nil {
			a = &attachTimes{}
		}
		attach.add(a.created, a.attached)
		attachedToRunning.add(a.attached, p.running)
	}
	fmt.Println()
	fmt.Printf("  %-38s %9s %9s %9s\n", "Per pod, as watched through the API", "p50", "p99", "max")
	for _, r := range []struct {
		name string
		d    *durations
	}{
		{"PVC created → PV created", &provisioned},
		{"PVC created → Bound", &bound},
		{"pod created → scheduled", &scheduled},
		{"VolumeAttachment created → attached", &attach},
		{"attached → pod Running", &attachedToRunning},
		{"pod scheduled → Running", &scheduledToRunning},
		{"pod created → Running", &createdToRunning},
	} {
		if !b.o.volumes && len(r.d.values) == 0 {
			continue // a volume's step, and there are none
		}
		fmt.Println(r.d.row(r.name))
	}
}
