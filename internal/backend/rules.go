package backend

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// The rules every image store applies the same way, written once: whether
// an existing image answers a repeated CreateVolume, whether a copy fits its
// source, that an image never shrinks, and the direct-I/O parameter of the
// stores that keep images as files. Each store still decides how it reads
// its records; these decide what the records mean.

// Compatible reports whether existing, the image a store already holds
// under spec.Name, answers spec: a repeated CreateVolume returns it, and a
// request that differs is ErrAlreadyExists naming every difference.
//
// A request with a capacity range fits any size within it; one without
// asks for exactly spec.CapacityBytes. A copy that names no fs type asked
// for whatever its source held.
func Compatible(existing *Image, spec VolumeSpec) error {
	var diffs []string
	switch {
	case spec.RequiredBytes == 0 && spec.LimitBytes == 0:
		if existing.CapacityBytes != spec.CapacityBytes {
			diffs = append(diffs, fmt.Sprintf("its size is %d bytes, not %d", existing.CapacityBytes, spec.CapacityBytes))
		}
	default:
		if spec.RequiredBytes > 0 && existing.CapacityBytes < spec.RequiredBytes {
			diffs = append(diffs, fmt.Sprintf("its size %d is below the required %d bytes", existing.CapacityBytes, spec.RequiredBytes))
		}
		if spec.LimitBytes > 0 && existing.CapacityBytes > spec.LimitBytes {
			diffs = append(diffs, fmt.Sprintf("its size %d is above the limit of %d bytes", existing.CapacityBytes, spec.LimitBytes))
		}
	}
	if existing.AccessType != spec.AccessType {
		diffs = append(diffs, fmt.Sprintf("it is a %s volume, not %s", existing.AccessType, spec.AccessType))
	}
	if existing.FsType != spec.FsType && (spec.Source == nil || spec.FsType != "") {
		diffs = append(diffs, fmt.Sprintf("its fs type is %q, not %q", existing.FsType, spec.FsType))
	}
	if !maps.Equal(existing.Parameters, spec.Parameters) {
		diffs = append(diffs, fmt.Sprintf("its parameters are %v, not %v", existing.Parameters, spec.Parameters))
	}
	if !maps.Equal(existing.MutableParameters, spec.MutableParameters) {
		diffs = append(diffs, fmt.Sprintf("its mutable parameters are %v, not %v", existing.MutableParameters, spec.MutableParameters))
	}
	if !sameSource(existing.Source, spec.Source) {
		diffs = append(diffs, fmt.Sprintf("it was copied from %s, not from %s", existing.Source, spec.Source))
	}
	if len(diffs) > 0 {
		return errdefs.AlreadyExists("volume %q already exists with other parameters: %s", spec.Name, strings.Join(diffs, "; "))
	}
	return nil
}

func sameSource(a, b *ContentSource) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// String names the source for messages: "snapshot X", "volume Y", or
// "nothing" for no source.
func (s *ContentSource) String() string {
	switch {
	case s == nil:
		return "nothing"
	case s.SnapshotID != "":
		return "snapshot " + s.SnapshotID
	}
	return "volume " + s.ImageID
}

// CopySource is what a copy is checked against: its source volume or
// snapshot as the source's store records it.
type CopySource struct {
	SizeBytes  int64
	AccessType AccessType
	FsType     string // "" when the store records none
}

// CopyFits checks a copy's request (spec, whose Source names the source)
// against its source: the same access type, no other filesystem than the
// source holds (a copy keeps its source's; a source that records none
// leaves the request's), and room for all of the source's data. Any
// other request is refused before anything is copied.
func CopyFits(spec VolumeSpec, src CopySource) error {
	if spec.AccessType != src.AccessType {
		return errdefs.InvalidArgument("volume %q asks for %s access, but its source %s is a %s volume; a copy keeps its source's access type", spec.Name, spec.AccessType, spec.Source, src.AccessType)
	}
	if spec.FsType != "" && src.FsType != "" && spec.FsType != src.FsType {
		return errdefs.InvalidArgument("volume %q asks for fs type %s, but its source %s holds %s; a copy keeps its source's filesystem", spec.Name, spec.FsType, spec.Source, src.FsType)
	}
	if spec.CapacityBytes < src.SizeBytes {
		return errdefs.OutOfRange("volume %q asks for %d bytes, smaller than its source %s of %d bytes", spec.Name, spec.CapacityBytes, spec.Source, src.SizeBytes)
	}
	return nil
}

// CheckExpand decides an Expand of the image id from currentBytes to
// newBytes: grow is true when the image must grow, false when it already
// has that size (nothing to do); a smaller size is ErrOutOfRange, since no
// store shrinks an image (the filesystem on it would be cut).
func CheckExpand(id string, currentBytes, newBytes int64) (grow bool, err error) {
	switch {
	case newBytes == currentBytes:
		return false, nil
	case newBytes < currentBytes:
		return false, errdefs.OutOfRange("volume %s is %d bytes and cannot shrink to %d bytes", id, currentBytes, newBytes)
	}
	return true, nil
}

// MutableParamDirectIO is the mutable (VolumeAttributesClass) parameter of
// the stores that keep images as files (loop, iscsi): "true" has the file
// opened with O_DIRECT, bypassing a page cache, "false" goes through it.
// Each backend says where the file is opened and what it defaults to.
const MutableParamDirectIO = "directIO"

// DirectIO is an image's direct-I/O setting: its MutableParamDirectIO, or
// byDefault when the image has none.
func DirectIO(img *Image, byDefault bool) bool {
	switch img.MutableParameters[MutableParamDirectIO] {
	case "true":
		return true
	case "false":
		return false
	}
	return byDefault
}

// DirectIOOnly is the mutable-parameter validation of a store whose one
// mutable parameter is MutableParamDirectIO, "true" or "false"; backendType
// names the backend when another key is refused.
func DirectIOOnly(backendType string) func(mutable map[string]string) error {
	return func(mutable map[string]string) error {
		for _, k := range slices.Sorted(maps.Keys(mutable)) {
			v := mutable[k]
			switch k {
			case MutableParamDirectIO:
				if v != "true" && v != "false" {
					return errdefs.InvalidArgument("mutable parameter %s=%q: the value must be \"true\" or \"false\"", k, v)
				}
			default:
				return errdefs.InvalidArgument("mutable parameter %q is not supported by the %s backend (it supports %s)", k, backendType, MutableParamDirectIO)
			}
		}
		return nil
	}
}
