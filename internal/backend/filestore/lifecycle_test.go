package filestore

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// TestListOrder: List sorts by ID, not by file name ("a-b.json" sorts
// before "a.json"), and shows only ready images.
func TestListOrder(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	for _, name := range []string{"a-b", "a", "b"} {
		if _, err := s.Create(ctx, blockSpec(name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.write(&record{State: stateCreating, Image: backend.Image{ID: "a-c", Name: "a-c", CapacityBytes: mib}}); err != nil {
		t.Fatal(err)
	}
	imgs, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, img := range imgs {
		ids = append(ids, img.ID)
	}
	if want := []string{"a", "a-b", "b"}; !slices.Equal(ids, want) {
		t.Fatalf("List = %v, want %v", ids, want)
	}
}

func TestExpand(t *testing.T) {
	ctx := t.Context()
	create := func(t *testing.T, s *Store) *backend.Image {
		t.Helper()
		img, err := s.Create(ctx, blockSpec("pvc-grow"))
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	sizes := func(t *testing.T, s *Store, id string) (file, record int64) {
		t.Helper()
		rec, err := s.read(id)
		if err != nil {
			t.Fatal(err)
		}
		return stat(t, s.ImagePath(id)).Size(), rec.CapacityBytes
	}

	t.Run("grows file and record, keeps it sparse", func(t *testing.T) {
		s := newStore(t)
		img := create(t, s)
		got, err := s.Expand(ctx, img.ID, 16*mib)
		if err != nil {
			t.Fatal(err)
		}
		if file, rec := sizes(t, s, img.ID); file != 16*mib || rec != 16*mib || got.CapacityBytes != 16*mib {
			t.Fatalf("file %d, record %d, returned %d; want all %d", file, rec, got.CapacityBytes, 16*mib)
		}
		if a := allocated(t, s.ImagePath(img.ID)); a >= 16*mib {
			t.Fatalf("the grown image has %d bytes allocated; growth must be a hole", a)
		}
		noTempFiles(t, s)
	})

	// The file grows before the record; a crash between them leaves a file
	// longer than its record, which the retried Expand completes.
	t.Run("interrupted expand is completed by the retry", func(t *testing.T) {
		s := newStore(t)
		img := create(t, s)
		if err := os.Truncate(s.ImagePath(img.ID), 16*mib); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Get(ctx, img.ID); err != nil || got.CapacityBytes != 4*mib {
			t.Fatalf("Get after the crash = %+v, %v; the record still says 4 MiB", got, err)
		}
		if _, err := s.Expand(ctx, img.ID, 16*mib); err != nil {
			t.Fatal(err)
		}
		if file, rec := sizes(t, s, img.ID); file != 16*mib || rec != 16*mib {
			t.Fatalf("after the retry: file %d, record %d; want %d", file, rec, 16*mib)
		}
	})

	// A file longer than the request (an interrupted Expand to more) is
	// never cut: a node may already see and use those bytes.
	t.Run("never cuts a longer file", func(t *testing.T) {
		s := newStore(t)
		img := create(t, s)
		if err := os.Truncate(s.ImagePath(img.ID), 16*mib); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Expand(ctx, img.ID, 8*mib); err != nil {
			t.Fatal(err)
		}
		if file, rec := sizes(t, s, img.ID); file != 16*mib || rec != 8*mib {
			t.Fatalf("file %d, record %d; want the file kept at %d, the record %d", file, rec, 16*mib, 8*mib)
		}
	})

	t.Run("provisioning cap counts the growth", func(t *testing.T) {
		s, err := New(Options{Dir: filepath.Join(t.TempDir(), "pool"), Name: "loop/capped", MaxProvisionedBytes: 8 * mib})
		if err != nil {
			t.Fatal(err)
		}
		img := create(t, s)
		if _, err := s.Expand(ctx, img.ID, 8*mib); err != nil {
			t.Fatalf("growing to exactly the cap: %v", err)
		}
		_, err = s.Expand(ctx, img.ID, 9*mib)
		testutil.WantKind(t, err, errdefs.ErrExhausted, "loop/capped", "8388608")
		if file, rec := sizes(t, s, img.ID); file != 8*mib || rec != 8*mib {
			t.Fatalf("a refused Expand changed the image: file %d, record %d", file, rec)
		}
	})

	t.Run("more than the pool has free", func(t *testing.T) {
		s := newStore(t)
		img := create(t, s)
		free, err := s.FreeBytes()
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Expand(ctx, img.ID, 4*mib+free+1<<30)
		testutil.WantKind(t, err, errdefs.ErrExhausted, "loop/test")
		if file, rec := sizes(t, s, img.ID); file != 4*mib || rec != 4*mib {
			t.Fatalf("a refused Expand changed the image: file %d, record %d", file, rec)
		}
	})

	t.Run("image file missing", func(t *testing.T) {
		s := newStore(t)
		img := create(t, s)
		if err := os.Remove(s.ImagePath(img.ID)); err != nil {
			t.Fatal(err)
		}
		_, err := s.Expand(ctx, img.ID, 8*mib)
		testutil.WantKind(t, err, errdefs.ErrPrecondition, img.ID, "missing")
		if _, err := os.Stat(s.ImagePath(img.ID)); !os.IsNotExist(err) {
			t.Fatalf("Expand made a new, empty image in place of the lost one: %v", err)
		}
	})

	t.Run("creating record", func(t *testing.T) {
		s := newStore(t)
		if err := s.write(&record{State: stateCreating, Image: backend.Image{ID: "pvc-half", Name: "pvc-half", CapacityBytes: mib}}); err != nil {
			t.Fatal(err)
		}
		_, err := s.Expand(ctx, "pvc-half", 2*mib)
		testutil.WantKind(t, err, errdefs.ErrNotFound, "pvc-half")
	})
}

func TestModifyValidation(t *testing.T) {
	ctx := t.Context()
	tests := []struct {
		name     string
		validate func(map[string]string) error
		mutable  map[string]string
		kind     error // nil: accepted
		mentions []string
	}{
		{"no validator refuses every key", nil, map[string]string{"b": "1", "a": "2"}, errdefs.ErrInvalidArgument, []string{`"a"`, "loop/test"}},
		{"no validator, nothing asked", nil, nil, nil, nil},
		{"validator accepts", func(map[string]string) error { return nil }, map[string]string{"tier": "fast"}, nil, nil},
		{"validator's kind is kept", func(map[string]string) error { return errdefs.InvalidArgument("tier %q is unknown", "gold") }, map[string]string{"tier": "gold"}, errdefs.ErrInvalidArgument, []string{"gold"}},
		{"a plain error becomes invalid argument", func(map[string]string) error { return errors.New("tier gold is unknown") }, map[string]string{"tier": "gold"}, errdefs.ErrInvalidArgument, []string{"gold", "loop/test"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(Options{Dir: filepath.Join(t.TempDir(), "pool"), Name: "loop/test", ValidateMutable: tt.validate})
			if err != nil {
				t.Fatal(err)
			}
			img, err := s.Create(ctx, blockSpec("pvc-modify"))
			if err != nil {
				t.Fatal(err)
			}
			got, modErr := s.Modify(ctx, img.ID, tt.mutable)
			spec := blockSpec("pvc-modify-at-create")
			spec.MutableParameters = tt.mutable
			created, createErr := s.Create(ctx, spec)
			if tt.kind != nil {
				testutil.WantKind(t, modErr, tt.kind, tt.mentions...)
				testutil.WantKind(t, createErr, tt.kind, tt.mentions...)
				if _, err := os.Stat(s.ImagePath(ImageIDForName(spec.Name))); !os.IsNotExist(err) {
					t.Fatalf("a refused Create left its image: %v", err)
				}
				return
			}
			if modErr != nil || createErr != nil {
				t.Fatalf("Modify: %v; Create: %v", modErr, createErr)
			}
			if !maps.Equal(got.MutableParameters, tt.mutable) || !maps.Equal(created.MutableParameters, tt.mutable) {
				t.Fatalf("Modify kept %v, Create %v; want %v", got.MutableParameters, created.MutableParameters, tt.mutable)
			}
		})
	}
}

// TestModifyMerges: Modify changes the keys it names and keeps the others,
// and an unchanged value does not rewrite the record.
func TestModifyMerges(t *testing.T) {
	s, err := New(Options{Dir: filepath.Join(t.TempDir(), "pool"), Name: "loop/test", ValidateMutable: func(map[string]string) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	spec := blockSpec("pvc-merge")
	spec.MutableParameters = map[string]string{"a": "1", "b": "2"}
	img, err := s.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Modify(ctx, img.ID, map[string]string{"b": "3", "c": "4"})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"a": "1", "b": "3", "c": "4"}; !maps.Equal(got.MutableParameters, want) {
		t.Fatalf("after Modify: %v, want %v", got.MutableParameters, want)
	}
	before := stat(t, s.metaPath(img.ID))
	if _, err := s.Modify(ctx, img.ID, map[string]string{"a": "1"}); err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, stat(t, s.metaPath(img.ID))) {
		t.Fatal("a Modify that changes nothing rewrote the record")
	}
}

func TestCapacity(t *testing.T) {
	ctx := t.Context()
	t.Run("free space", func(t *testing.T) {
		s := newStore(t)
		c, err := s.Capacity(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c.AvailableBytes <= 0 || c.MaximumVolumeBytes != c.AvailableBytes {
			t.Fatalf("Capacity = %+v", c)
		}
	})
	t.Run("capped", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "pool")
		s, err := New(Options{Dir: dir, Name: "loop/capped", MaxProvisionedBytes: 10 * mib})
		if err != nil {
			t.Fatal(err)
		}
		spec := blockSpec("pvc-3m")
		spec.CapacityBytes = 3 * mib
		if _, err := s.Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
		c, err := s.Capacity(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c.AvailableBytes != 7*mib || c.MaximumVolumeBytes != 7*mib {
			t.Fatalf("Capacity = %+v, want 7 MiB of the 10 MiB cap", c)
		}
		// A cap lowered below what is provisioned leaves nothing, not less.
		lowered, err := New(Options{Dir: dir, Name: "loop/capped", MaxProvisionedBytes: 2 * mib})
		if err != nil {
			t.Fatal(err)
		}
		if c, err := lowered.Capacity(ctx); err != nil || c.AvailableBytes != 0 || c.MaximumVolumeBytes != 0 {
			t.Fatalf("Capacity over the cap = %+v, %v; want zero", c, err)
		}
	})
}

// TestUpdateInPool: fn sees every other ready image (not the one it
// changes, not half-created ones), and the others are copies.
func TestUpdateInPool(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	for _, name := range []string{"pvc-a", "pvc-b", "pvc-c"} {
		if _, err := s.Create(ctx, blockSpec(name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.write(&record{State: stateCreating, Image: backend.Image{ID: "pvc-half", Name: "pvc-half"}}); err != nil {
		t.Fatal(err)
	}
	var seen []string
	_, err := s.UpdateInPool(ctx, "pvc-b", func(img *backend.Image, others []*backend.Image) error {
		for _, o := range others {
			seen = append(seen, o.ID)
			o.CapacityBytes = 1 // a copy: changes nothing
		}
		img.Formatted = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(seen)
	if want := []string{"pvc-a", "pvc-c"}; !slices.Equal(seen, want) {
		t.Fatalf("fn saw %v, want %v", seen, want)
	}
	for _, id := range []string{"pvc-a", "pvc-c"} {
		if img, err := s.Get(ctx, id); err != nil || img.CapacityBytes != 4*mib {
			t.Fatalf("Get(%s) = %+v, %v; changing fn's copy changed the record", id, img, err)
		}
	}
	if img, err := s.Get(ctx, "pvc-b"); err != nil || !img.Formatted {
		t.Fatalf("Get(pvc-b) = %+v, %v; want the update stored", img, err)
	}
	_, err = s.UpdateInPool(ctx, "pvc-none", func(*backend.Image, []*backend.Image) error { t.Fatal("fn called for a missing image"); return nil })
	testutil.WantKind(t, err, errdefs.ErrNotFound, "pvc-none")
}
