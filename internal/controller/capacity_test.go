package controller

import (
	"testing"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

func TestResolveCapacity(t *testing.T) {
	t.Parallel()
	const xfsMin, ext4Min = 300 * mib, 1 * mib
	tests := []struct {
		name            string
		required, limit int64
		min             int64
		want            int64
		kind            error // nil = success
	}{
		{name: "default", want: 1 * gib},
		{name: "default with the ext4 minimum", min: ext4Min, want: 1 * gib},
		{name: "default with the xfs minimum", min: xfsMin, want: 1 * gib},
		{name: "default capped by a lower limit", limit: 100 * mib, want: 100 * mib},
		{name: "default capped by an unaligned limit", limit: 100*mib + 1, want: 100 * mib},
		{name: "default capped by a limit below one MiB", limit: 1000, kind: errdefs.ErrOutOfRange},
		{name: "default with a higher limit", limit: 5 * gib, want: 1 * gib},
		{name: "one byte rounds up to a MiB", required: 1, want: 1 * mib},
		{name: "exact MiB", required: 7 * mib, want: 7 * mib},
		{name: "MiB plus one rounds up", required: 7*mib + 1, want: 8 * mib},
		{name: "rounding up stays within the limit", required: 7*mib + 1, limit: 8 * mib, want: 8 * mib},
		{name: "xfs minimum", required: 10 * mib, min: xfsMin, want: xfsMin},
		{name: "xfs minimum within the limit", required: 10 * mib, limit: 500 * mib, min: xfsMin, want: xfsMin},
		{name: "xfs default capped by a limit", limit: 500 * mib, min: xfsMin, want: 500 * mib},
		{name: "limit below the xfs minimum", required: 10 * mib, limit: 200 * mib, min: xfsMin, kind: errdefs.ErrOutOfRange},
		{name: "default limit below the xfs minimum", limit: 200 * mib, min: xfsMin, kind: errdefs.ErrOutOfRange},
		{name: "rounding exceeds the limit", required: 7*mib + 1, limit: 7*mib + 100, kind: errdefs.ErrOutOfRange},
		{name: "largest", required: MaxCapacity, want: MaxCapacity},
		{name: "larger than the largest", required: MaxCapacity + 1, kind: errdefs.ErrOutOfRange},
		{name: "required equals limit", required: 64 * mib, limit: 64 * mib, want: 64 * mib},
		{name: "negative required", required: -1, kind: errdefs.ErrInvalidArgument},
		{name: "negative limit", limit: -1, kind: errdefs.ErrInvalidArgument},
		{name: "required above limit", required: 2 * mib, limit: 1 * mib, kind: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ResolveCapacity(tt.required, tt.limit, tt.min)
			if tt.kind != nil {
				if err == nil {
					t.Fatalf("ResolveCapacity(%d, %d, min %d) = %d, want a %v error", tt.required, tt.limit, tt.min, got, tt.kind)
				}
				if errdefs.KindOf(err) != tt.kind {
					t.Fatalf("error %q is of kind %v, want %v", err, errdefs.KindOf(err), tt.kind)
				}
				return
			}
			if err != nil {
				t.Fatalf("ResolveCapacity(%d, %d, min %d): %v", tt.required, tt.limit, tt.min, err)
			}
			if got != tt.want {
				t.Fatalf("ResolveCapacity(%d, %d, min %d) = %d, want %d", tt.required, tt.limit, tt.min, got, tt.want)
			}
			// The invariants every size keeps.
			if got%mib != 0 || got < tt.required || got < tt.min || (tt.limit > 0 && got > tt.limit) {
				t.Fatalf("size %d breaks an invariant of range [%d, %d] min %d", got, tt.required, tt.limit, tt.min)
			}
		})
	}
}
