package controller

import (
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Capacity rules.
const (
	mib = int64(1) << 20
	gib = int64(1) << 30
	// defaultCapacity is used when the request names no size.
	defaultCapacity = 1 * gib
	// capacityUnit: sizes are rounded up to whole MiB, which every
	// filesystem's block size and every device's sector size divides.
	capacityUnit = mib
	// MaxCapacity keeps sizes far from int64 overflow and from what a
	// single sparse file or loop device should be asked to hold: the
	// largest volume Spindle creates.
	MaxCapacity = 64 << 40
)

// ResolveCapacity picks the size to allocate for a capacity range (0 is
// unset): the required size (or the default, capped by the limit and then
// rounded down to a MiB so that it stays within it), at least minBytes,
// rounded up to a MiB; OUT_OF_RANGE when that exceeds the limit.
func ResolveCapacity(required, limit, minBytes int64) (int64, error) {
	if required < 0 || limit < 0 {
		return 0, errdefs.InvalidArgument("capacity_range must not be negative (required_bytes %d, limit_bytes %d)", required, limit)
	}
	if limit > 0 && required > limit {
		return 0, errdefs.InvalidArgument("capacity_range.required_bytes %d exceeds limit_bytes %d", required, limit)
	}
	size := required
	if size == 0 {
		size = defaultCapacity
		if limit > 0 && limit < size {
			// The largest whole-MiB size within the limit; a limit below
			// one MiB leaves none, and the check below says so.
			size = limit
			if whole := limit / capacityUnit * capacityUnit; whole > 0 {
				size = whole
			}
		}
	}
	if size < minBytes {
		size = minBytes
	}
	if size > MaxCapacity {
		return 0, errdefs.OutOfRange("%d bytes is more than the largest volume Spindle creates (%d bytes)", size, int64(MaxCapacity))
	}
	size = (size + capacityUnit - 1) / capacityUnit * capacityUnit
	if limit > 0 && size > limit {
		return 0, errdefs.OutOfRange("no size within capacity_range [%d, %d] bytes is possible: volumes are whole MiB, and at least %d bytes for this filesystem", required, limit, minBytes)
	}
	return size, nil
}
