package backend

import (
	"testing"

	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

const mib = 1 << 20

func TestCompatible(t *testing.T) {
	fromSnap := &ContentSource{SnapshotID: "snap-1"}
	existing := func(change func(*Image)) *Image {
		img := &Image{ID: "pvc-1", Name: "pvc-1", CapacityBytes: 8 * mib, AccessType: AccessMount, FsType: "ext4",
			Parameters: map[string]string{"mkfsOptions": "-K"}, MutableParameters: map[string]string{"directIO": "false"}}
		if change != nil {
			change(img)
		}
		return img
	}
	spec := func(change func(*VolumeSpec)) VolumeSpec {
		s := VolumeSpec{Name: "pvc-1", CapacityBytes: 8 * mib, RequiredBytes: 8 * mib, AccessType: AccessMount, FsType: "ext4",
			Parameters: map[string]string{"mkfsOptions": "-K"}, MutableParameters: map[string]string{"directIO": "false"}}
		if change != nil {
			change(&s)
		}
		return s
	}
	tests := []struct {
		name     string
		existing *Image
		spec     VolumeSpec
		mentions []string // nil: compatible
	}{
		{"the same request", existing(nil), spec(nil), nil},
		{"a range the size fits", existing(nil), spec(func(s *VolumeSpec) { s.RequiredBytes, s.LimitBytes = 4*mib, 16*mib }), nil},
		{"no range, the same size", existing(nil), spec(func(s *VolumeSpec) { s.RequiredBytes = 0 }), nil},
		{"no range, another size", existing(nil), spec(func(s *VolumeSpec) { s.RequiredBytes, s.CapacityBytes = 0, 16*mib }), []string{"its size is 8388608 bytes, not 16777216"}},
		{"bigger than it is", existing(nil), spec(func(s *VolumeSpec) { s.RequiredBytes = 16 * mib }), []string{"below the required 16777216"}},
		{"a limit below it", existing(nil), spec(func(s *VolumeSpec) { s.RequiredBytes, s.LimitBytes = 0, 4*mib }), []string{"above the limit of 4194304"}},
		{"block, not mount", existing(nil), spec(func(s *VolumeSpec) { s.AccessType, s.FsType = AccessBlock, "" }), []string{"a mount volume, not block", "fs type"}},
		{"another fs type", existing(nil), spec(func(s *VolumeSpec) { s.FsType = "xfs" }), []string{`its fs type is "ext4", not "xfs"`}},
		{"other parameters", existing(nil), spec(func(s *VolumeSpec) { s.Parameters = nil }), []string{"its parameters are map[mkfsOptions:-K], not map[]"}},
		{"other mutable parameters", existing(nil), spec(func(s *VolumeSpec) { s.MutableParameters = nil }), []string{"mutable parameters"}},
		{"a copy of something else", existing(func(i *Image) { i.Source = fromSnap }), spec(func(s *VolumeSpec) { s.Source = &ContentSource{ImageID: "pvc-0"} }), []string{"copied from snapshot snap-1, not from volume pvc-0"}},
		{"a copy, not a new volume", existing(func(i *Image) { i.Source = fromSnap }), spec(nil), []string{"copied from snapshot snap-1, not from nothing"}},
		{"a copy leaves the fs type to its source", existing(func(i *Image) { i.Source = fromSnap }), spec(func(s *VolumeSpec) { s.Source, s.FsType = fromSnap, "" }), nil},
		{"a copy that names another fs type", existing(func(i *Image) { i.Source = fromSnap }), spec(func(s *VolumeSpec) { s.Source, s.FsType = fromSnap, "xfs" }), []string{"fs type"}},
		{"every difference named", existing(nil), spec(func(s *VolumeSpec) { s.RequiredBytes, s.FsType = 16*mib, "xfs" }), []string{"below the required", "; its fs type"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Compatible(tc.existing, tc.spec)
			if tc.mentions == nil {
				if err != nil {
					t.Fatalf("Compatible = %v, want compatible", err)
				}
				return
			}
			testutil.WantKind(t, err, errdefs.ErrAlreadyExists, append([]string{`volume "pvc-1" already exists`}, tc.mentions...)...)
		})
	}
}

func TestCopyFits(t *testing.T) {
	source := CopySource{SizeBytes: 8 * mib, AccessType: AccessMount, FsType: "xfs"}
	spec := func(change func(*VolumeSpec)) VolumeSpec {
		s := VolumeSpec{Name: "pvc-copy", CapacityBytes: 8 * mib, AccessType: AccessMount, Source: &ContentSource{SnapshotID: "snap-1"}}
		if change != nil {
			change(&s)
		}
		return s
	}
	tests := []struct {
		name     string
		spec     VolumeSpec
		src      CopySource
		kind     error // nil: fits
		mentions []string
	}{
		{"as big, fs type left to the source", spec(nil), source, nil, nil},
		{"bigger, the same fs type", spec(func(s *VolumeSpec) { s.CapacityBytes, s.FsType = 16*mib, "xfs" }), source, nil, nil},
		{"a source that records no fs type", spec(func(s *VolumeSpec) { s.FsType = "ext4" }), CopySource{SizeBytes: 8 * mib, AccessType: AccessMount}, nil, nil},
		{"smaller", spec(func(s *VolumeSpec) { s.CapacityBytes = 4 * mib }), source, errdefs.ErrOutOfRange, []string{`"pvc-copy"`, "4194304", "snapshot snap-1", "8388608"}},
		{"another fs type", spec(func(s *VolumeSpec) { s.FsType = "ext4" }), source, errdefs.ErrInvalidArgument, []string{"ext4", "snapshot snap-1 holds xfs"}},
		{"block of a mount volume", spec(func(s *VolumeSpec) { s.AccessType = AccessBlock }), source, errdefs.ErrInvalidArgument, []string{"block access", "a mount volume"}},
		{"of a volume", spec(func(s *VolumeSpec) { s.Source, s.CapacityBytes = &ContentSource{ImageID: "pvc-0"}, mib }), source, errdefs.ErrOutOfRange, []string{"volume pvc-0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CopyFits(tc.spec, tc.src)
			if tc.kind == nil {
				if err != nil {
					t.Fatalf("CopyFits = %v, want it to fit", err)
				}
				return
			}
			testutil.WantKind(t, err, tc.kind, tc.mentions...)
		})
	}
}

func TestCheckExpand(t *testing.T) {
	tests := []struct {
		name          string
		current, next int64
		grow          bool
		shrink        bool
	}{
		{"grow", 8 * mib, 16 * mib, true, false},
		{"the same size", 8 * mib, 8 * mib, false, false},
		{"shrink", 16 * mib, 8 * mib, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			grow, err := CheckExpand("pvc-1", tc.current, tc.next)
			if tc.shrink {
				testutil.WantKind(t, err, errdefs.ErrOutOfRange, "pvc-1", "16777216", "cannot shrink to 8388608")
				if grow {
					t.Fatal("a refused shrink says grow")
				}
				return
			}
			if err != nil || grow != tc.grow {
				t.Fatalf("CheckExpand = %t, %v; want %t, nil", grow, err, tc.grow)
			}
		})
	}
}

func TestDirectIO(t *testing.T) {
	tests := []struct {
		value     string // "" unset
		byDefault bool
		want      bool
	}{
		{"", true, true},
		{"", false, false},
		{"true", false, true},
		{"false", true, false},
		// A value that is neither (only a record older than the
		// validation could hold one) is the backend's default.
		{"yes", true, true},
		{"yes", false, false},
	}
	for _, tc := range tests {
		img := &Image{}
		if tc.value != "" {
			img.MutableParameters = map[string]string{MutableParamDirectIO: tc.value}
		}
		if got := DirectIO(img, tc.byDefault); got != tc.want {
			t.Errorf("DirectIO(%q, default %t) = %t, want %t", tc.value, tc.byDefault, got, tc.want)
		}
	}
}

func TestDirectIOOnly(t *testing.T) {
	validate := DirectIOOnly("loop")
	tests := []struct {
		name     string
		mutable  map[string]string
		mentions []string // nil: accepted
	}{
		{"none", nil, nil},
		{"on", map[string]string{MutableParamDirectIO: "true"}, nil},
		{"off", map[string]string{MutableParamDirectIO: "false"}, nil},
		{"not a boolean", map[string]string{MutableParamDirectIO: "yes"}, []string{MutableParamDirectIO, `"yes"`, `"true" or "false"`}},
		{"another key", map[string]string{"iops": "100"}, []string{`"iops"`, "the loop backend", MutableParamDirectIO}},
		// Refusals are the same whatever the map's order: the first key
		// in sorted order is named.
		{"two unknown keys", map[string]string{"iops": "1", "cache": "on"}, []string{`"cache"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := validate(tc.mutable)
			if tc.mentions == nil {
				if err != nil {
					t.Fatalf("validate = %v, want accepted", err)
				}
				return
			}
			testutil.WantKind(t, err, errdefs.ErrInvalidArgument, tc.mentions...)
		})
	}
}

func TestContentSourceString(t *testing.T) {
	for _, tc := range []struct {
		src  *ContentSource
		want string
	}{
		{nil, "nothing"},
		{&ContentSource{SnapshotID: "snap-1"}, "snapshot snap-1"},
		{&ContentSource{ImageID: "pvc-1"}, "volume pvc-1"},
	} {
		if got := tc.src.String(); got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.src, got, tc.want)
		}
	}
}
