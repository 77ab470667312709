package main

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// messagesShown is how many distinct messages printWarnings shows per
// reason: enough to tell a scheduler retry from a mount failure.
const messagesShown = 3

// Object names and numbers differ from event to event; replacing them lets
// events that say the same thing about different pods count together.
var (
	benchName   = regexp.MustCompile(`bench-\d+`)
	volumeName  = regexp.MustCompile(`pvc-[0-9a-f-]{36}`)
	bareNumbers = regexp.MustCompile(`\b\d+(\.\d+)?(ms|s)?\b`)
)

// messageShape is msg with the names and numbers that vary per object
// replaced, so that "0/1 nodes are available: ... bench-017 not found"
// and the same for bench-042 are one shape.
func messageShape(msg string) string {
	msg = benchName.ReplaceAllString(strings.TrimSpace(msg), "bench-N")
	msg = volumeName.ReplaceAllString(msg, "pvc-UID")
	return bareNumbers.ReplaceAllString(msg, "N")
}

// warningSummary is the Warning events of one reason.
type warningSummary struct {
	reason string
	count  int32
	shapes []shapeCount // most frequent first
}

type shapeCount struct {
	shape string
	count int32
}

// summarizeWarnings groups events by reason, then by message shape, both
// ordered by how often they happened (an event's Count included).
func summarizeWarnings(events []corev1.Event) []warningSummary {
	byReason := map[string]map[string]int32{}
	for _, e := range events {
		if byReason[e.Reason] == nil {
			byReason[e.Reason] = map[string]int32{}
		}
		byReason[e.Reason][messageShape(e.Message)] += max(e.Count, 1)
	}
	out := make([]warningSummary, 0, len(byReason))
	for reason, shapes := range byReason {
		s := warningSummary{reason: reason}
		for shape, n := range shapes {
			s.count += n
			s.shapes = append(s.shapes, shapeCount{shape, n})
		}
		sort.Slice(s.shapes, func(i, j int) bool {
			if s.shapes[i].count != s.shapes[j].count {
				return s.shapes[i].count > s.shapes[j].count
			}
			return s.shapes[i].shape < s.shapes[j].shape
		})
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].count != out[j].count {
			return out[i].count > out[j].count
		}
		return out[i].reason < out[j].reason
	})
	return out
}

// printWarnings counts the namespace's Warning events by reason, with
// their commonest messages: retries (FailedScheduling, FailedMount,
// FailedAttachVolume, ...) show where the apply waited, and the message
// says on what.
func (b *bench) printWarnings(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	events, err := b.client.CoreV1().Events(b.o.namespace).List(cctx, metav1.ListOptions{FieldSelector: "type=Warning"})
	fmt.Println()
	if err != nil {
		fmt.Printf("Warning events: cannot list them: %v\n", err)
		return
	}
	summary := summarizeWarnings(events.Items)
	if len(summary) == 0 {
		fmt.Println("Warning events: none")
		return
	}
	fmt.Println("Warning events, by reason and message (names and numbers replaced by N):")
	for _, s := range summary {
		fmt.Printf("  %s %d\n", s.reason, s.count)
		for i, sc := range s.shapes {
			if i == messagesShown {
				fmt.Printf("    (%d more messages)\n", len(s.shapes)-i)
				break
			}
			fmt.Printf("    %4d  %s\n", sc.count, sc.shape)
		}
	}
}
