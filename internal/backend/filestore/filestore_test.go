package filestore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/testutil"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/atomicfile"
	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

const mib = int64(1) << 20

func newStore(t *testing.T) *Store {
	t.Helper()
	s, err := New(Options{Dir: filepath.Join(t.TempDir(), "pool"), Name: "loop/test"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func blockSpec(name string) backend.VolumeSpec {
	return backend.VolumeSpec{Name: name, CapacityBytes: 4 * mib, AccessType: backend.AccessBlock}
}

// noTempFiles fails when an atomicfile temporary is left anywhere in the pool.
func noTempFiles(t *testing.T, s *Store) {
	t.Helper()
	for _, dir := range []string{s.Dir(), filepath.Join(s.Dir(), nodesDir)} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), atomicfile.TempPrefix) {
				t.Fatalf("temporary file left behind: %s", filepath.Join(dir, e.Name()))
			}
		}
	}
}

func stat(t *testing.T, path string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

func TestImageIDForName(t *testing.T) {
	hashed := regexp.MustCompile(`^vol-[0-9a-f]{40}$`)
	tests := []struct {
		name string
		kept bool // used as it is; otherwise hashed
	}{
		{"pvc-6f1c2a9e-2b7d-4c1e-9a55-0d3f1e2b4c5d", true},
		{"a", true},
		{"vol.1_x", true},
		{strings.Repeat("a", 63), true},
		{strings.Repeat("a", 64), false},           // longer than a plain name may be
		{"PVC-Upper", false},                       // upper case
		{"-leading-dash", false},                   // must start alphanumeric
		{".hidden", false},                         // would be a hidden file
		{"a..b", false},                            // no ".."
		{"ns/name", false},                         // a path separator
		{"has space", false},                       // outside the alphabet
		{"", false},                                // empty
		{"vol-" + strings.Repeat("ab", 20), false}, // looks like a hash: hashed again, so it cannot collide with one
	}
	seen := map[string]string{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := ImageIDForName(tt.name)
			if again := ImageIDForName(tt.name); again != id {
				t.Fatalf("not deterministic: %q then %q", id, again)
			}
			if tt.kept {
				if id != tt.name {
					t.Fatalf("ImageIDForName(%q) = %q, want the name kept", tt.name, id)
				}
			} else {
				if !hashed.MatchString(id) || id == tt.name {
					t.Fatalf("ImageIDForName(%q) = %q, want a vol-<sha> hash", tt.name, id)
				}
			}
			if err := validID(id); err != nil {
				t.Fatalf("the ID %q is not a valid file image name: %v", id, err)
			}
			if other, dup := seen[id]; dup {
				t.Fatalf("names %q and %q map to the same ID %s", other, tt.name, id)
			}
			seen[id] = tt.name
		})
	}
}

func TestNewRequiresAbsoluteDir(t *testing.T) {
	for _, dir := range []string{"", "relative/pool"} {
		_, err := New(Options{Dir: dir})
		testutil.WantKind(t, err, errdefs.ErrInvalidArgument)
	}
}

// TestNewResolvesSymlinks: the kernel reports a loop device's backing file
// by its resolved path, so image paths must be resolved too.
func TestNewResolvesSymlinks(t *testing.T) {
	real := filepath.Join(t.TempDir(), "real")
	if err := os.Mkdir(real, 0o750); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Dir: link})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.EvalSymlinks(real)
	if s.Dir() != want || s.ImagePath("x") != filepath.Join(want, "x.img") {
		t.Fatalf("Dir = %s, ImagePath = %s; want under %s", s.Dir(), s.ImagePath("x"), want)
	}
}

func TestInvalidIDs(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	for _, id := range []string{"", "../etc/passwd", "a/b", ".spindle", "a..b", "nul\x00"} {
		t.Run(fmt.Sprintf("%q", id), func(t *testing.T) {
			_, err := s.Get(ctx, id)
			testutil.WantKind(t, err, errdefs.ErrInvalidArgument)
			testutil.WantKind(t, s.Delete(ctx, id), errdefs.ErrInvalidArgument)
			_, err = s.Update(ctx, id, func(*backend.Image) error { return nil })
			testutil.WantKind(t, err, errdefs.ErrInvalidArgument)
		})
	}
}

func TestCreateWritesSparseImageAndPrivateMetadata(t *testing.T) {
	s := newStore(t)
	img, err := s.Create(t.Context(), blockSpec("pvc-files"))
	if err != nil {
		t.Fatal(err)
	}
	fi := stat(t, s.ImagePath(img.ID))
	if fi.Size() != 4*mib {
		t.Fatalf("image size = %d, want %d", fi.Size(), 4*mib)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("image mode = %v, want 0600", fi.Mode().Perm())
	}
	if fi.Sys().(*syscall.Stat_t).Blocks*512 >= 4*mib {
		t.Fatalf("image uses %d bytes on disk; want it sparse", fi.Sys().(*syscall.Stat_t).Blocks*512)
	}
	if m := stat(t, s.metaPath(img.ID)).Mode().Perm(); m != 0o600 {
		t.Fatalf("metadata mode = %v, want 0600 (it names nodes and volumes)", m)
	}
	if _, err := s.Update(t.Context(), img.ID, func(i *backend.Image) error { i.Formatted = true; return nil }); err != nil {
		t.Fatal(err)
	}
	if m := stat(t, s.metaPath(img.ID)).Mode().Perm(); m != 0o600 {
		t.Fatalf("metadata mode after Update = %v, want 0600", m)
	}
	rec, err := s.read(img.ID)
	if err != nil || rec.State != stateReady || rec.Version != recordVersion {
		t.Fatalf("record = %+v, %v; want a ready record of version %d", rec, err, recordVersion)
	}
	noTempFiles(t, s)
}

// TestCreatingRecordIsRedone: a crash between the "creating" record and the
// "ready" one leaves a record that Get does not show and the next Create
// replaces, whatever the old record asked for.
func TestCreatingRecordIsRedone(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	spec := blockSpec("pvc-crashed")
	id := ImageIDForName(spec.Name)
	stale := backend.Image{ID: id, Name: spec.Name, CapacityBytes: 64 * mib, AccessType: backend.AccessMount, FsType: "xfs"}
	if err := s.write(&record{State: stateCreating, Image: stale}); err != nil {
		t.Fatal(err)
	}
	// The half-written image, bigger than the new request.
	if err := os.WriteFile(s.ImagePath(id), []byte("half written"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(s.ImagePath(id), 64*mib); err != nil {
		t.Fatal(err)
	}

	_, err := s.Get(ctx, id)
	testutil.WantKind(t, err, errdefs.ErrNotFound, id)
	if n, err := s.ProvisionedBytes(); err != nil || n != 0 {
		t.Fatalf("ProvisionedBytes = %d, %v; a creating record holds no space", n, err)
	}

	img, err := s.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create over a creating record: %v", err)
	}
	if img.CapacityBytes != spec.CapacityBytes || img.AccessType != backend.AccessBlock || img.FsType != "" {
		t.Fatalf("Create = %+v; want the new spec, not the stale record", img)
	}
	if fi := stat(t, s.ImagePath(id)); fi.Size() != spec.CapacityBytes {
		t.Fatalf("image size = %d, want %d", fi.Size(), spec.CapacityBytes)
	}
	data, err := os.ReadFile(s.ImagePath(id))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data[:64]), "half written") {
		t.Fatal("the half-written image's data survived into the new volume")
	}
	if got, err := s.Get(ctx, id); err != nil || got.CapacityBytes != spec.CapacityBytes {
		t.Fatalf("Get = %+v, %v", got, err)
	}
}

// TestDeleteOfCreatingRecord: DeleteVolume of a volume whose create crashed
// cleans it up too.
func TestDeleteOfCreatingRecord(t *testing.T) {
	s := newStore(t)
	id := ImageIDForName("pvc-crashed")
	if err := s.write(&record{State: stateCreating, Image: backend.Image{ID: id, Name: "pvc-crashed", CapacityBytes: mib}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.ImagePath(id), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{s.metaPath(id), s.ImagePath(id)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s survived Delete: %v", p, err)
		}
	}
}

// TestImageWithoutMetadata: an image file without a record is what an
// interrupted create or delete leaves; Create, Delete and opening the store
// all remove it.
func TestImageWithoutMetadata(t *testing.T) {
	leftover := func(t *testing.T, s *Store, id string) {
		t.Helper()
		if err := os.WriteFile(s.ImagePath(id), []byte("old tenant data"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("Delete", func(t *testing.T) {
		s := newStore(t)
		id := ImageIDForName("pvc-leftover")
		leftover(t, s, id)
		if err := s.Delete(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(s.ImagePath(id)); !os.IsNotExist(err) {
			t.Fatalf("the leftover image survived Delete: %v", err)
		}
	})
	t.Run("New", func(t *testing.T) {
		s := newStore(t)
		leftover(t, s, "pvc-orphan")
		if err := os.WriteFile(filepath.Join(s.Dir(), atomicfile.TempPrefix+"pvc-a.json-123"), []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Create(t.Context(), blockSpec("pvc-kept")); err != nil {
			t.Fatal(err)
		}
		reopened, err := New(Options{Dir: s.Dir(), Name: "loop/test"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(s.ImagePath("pvc-orphan")); !os.IsNotExist(err) {
			t.Fatalf("the orphan image survived opening the store: %v", err)
		}
		noTempFiles(t, reopened)
		if _, err := reopened.Get(t.Context(), "pvc-kept"); err != nil {
			t.Fatalf("a real volume did not survive opening the store: %v", err)
		}
	})
	t.Run("Create", func(t *testing.T) {
		s := newStore(t)
		spec := blockSpec("pvc-leftover")
		id := ImageIDForName(spec.Name)
		leftover(t, s, id)
		if _, err := s.Create(t.Context(), spec); err != nil {
			t.Fatal(err)
		}
		// The content tells a reused file from a new one (an inode
		// number may be reused by the new file).
		data, err := os.ReadFile(s.ImagePath(id))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data[:64]), "old tenant") || int64(len(data)) != spec.CapacityBytes {
			t.Fatalf("the new image holds %q... (%d bytes); want %d zero bytes", data[:16], len(data), spec.CapacityBytes)
		}
	})
}

func TestUpdate(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	img, err := s.Create(ctx, blockSpec("pvc-update"))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("unchanged does not rewrite", func(t *testing.T) {
		before := stat(t, s.metaPath(img.ID))
		got, err := s.Update(ctx, img.ID, func(i *backend.Image) error {
			i.Formatted = true // discarded: the function says unchanged
			return ErrUnchanged
		})
		if err != nil {
			t.Fatal(err)
		}
		if got.Formatted {
			t.Fatal("Update returned the discarded change")
		}
		// atomicfile replaces the file by rename, so a rewrite is a new inode.
		if !os.SameFile(before, stat(t, s.metaPath(img.ID))) {
			t.Fatal("an unchanged Update rewrote the metadata")
		}
	})

	t.Run("change is written", func(t *testing.T) {
		before := stat(t, s.metaPath(img.ID))
		got, err := s.Update(ctx, img.ID, func(i *backend.Image) error {
			i.Formatted, i.FsType = true, "ext4"
			i.ID, i.Name = "renamed", "other-name" // ignored: Update may not rename
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if os.SameFile(before, stat(t, s.metaPath(img.ID))) {
			t.Fatal("a changing Update did not rewrite the metadata")
		}
		stored, err := s.Get(ctx, img.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range []*backend.Image{got, stored} {
			if !i.Formatted || i.FsType != "ext4" || i.ID != img.ID || i.Name != img.Name {
				t.Fatalf("image = %+v; want formatted ext4 under its own ID and name", i)
			}
		}
		noTempFiles(t, s)
	})

	t.Run("function error aborts", func(t *testing.T) {
		before := stat(t, s.metaPath(img.ID))
		boom := errdefs.Precondition("not now")
		_, err := s.Update(ctx, img.ID, func(i *backend.Image) error { i.CapacityBytes = 1; return boom })
		if !errors.Is(err, boom) {
			t.Fatalf("Update = %v, want the function's error", err)
		}
		if !os.SameFile(before, stat(t, s.metaPath(img.ID))) {
			t.Fatal("an aborted Update rewrote the metadata")
		}
	})

	t.Run("missing image", func(t *testing.T) {
		_, err := s.Update(ctx, "pvc-none", func(*backend.Image) error { t.Fatal("fn called for a missing image"); return nil })
		testutil.WantKind(t, err, errdefs.ErrNotFound, "pvc-none")
	})
}

func TestCorruptMetadata(t *testing.T) {
	tests := []struct {
		name    string
		content string
		mention string
	}{
		{"not json", "{\"version\": 1, \"state\": \"rea", "corrupt"},
		{"other version", `{"version": 7, "state": "ready", "id": "pvc-x"}`, "version 7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			ctx := t.Context()
			if _, err := s.Create(ctx, blockSpec("pvc-x")); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(s.metaPath("pvc-x"), []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, getErr := s.Get(ctx, "pvc-x")
			_, createErr := s.Create(ctx, blockSpec("pvc-x"))
			deleteErr := s.Delete(ctx, "pvc-x")
			for op, err := range map[string]error{"Get": getErr, "Create": createErr, "Delete": deleteErr} {
				if err == nil {
					t.Fatalf("%s over corrupt metadata succeeded", op)
				}
				// Not "not found": that would let Create overwrite or Delete
				// drop a volume we can no longer read.
				if errdefs.KindOf(err) == errdefs.ErrNotFound {
					t.Fatalf("%s: %v is reported as not found", op, err)
				}
				for _, m := range []string{s.metaPath("pvc-x"), tt.mention} {
					if !strings.Contains(err.Error(), m) {
						t.Fatalf("%s error %q does not name %q", op, err, m)
					}
				}
			}
			if _, err := os.Stat(s.ImagePath("pvc-x")); err != nil {
				t.Fatalf("the image behind corrupt metadata was touched: %v", err)
			}
		})
	}
}

// TestLockBusy holds the pool flock through another open file description,
// as another process (a node plugin, a second controller) would.
func TestLockBusy(t *testing.T) {
	s := newStore(t)
	f, err := os.OpenFile(filepath.Join(s.Dir(), lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}

	short := func(t *testing.T) context.Context {
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  func(*testing.T) context.Context
	}{
		{"deadline passes", short},
		{"context cancelled", func(*testing.T) context.Context { return cancelled }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Create(tc.ctx(t), blockSpec("pvc-locked"))
			testutil.WantKind(t, err, errdefs.ErrBusy, "loop/test")
			if _, err := os.Stat(s.ImagePath("pvc-locked")); !os.IsNotExist(err) {
				t.Fatalf("Create wrote an image without the lock: %v", err)
			}
			testutil.WantKind(t, s.Delete(tc.ctx(t), "pvc-locked"), errdefs.ErrBusy)
		})
	}

	if err := unix.Flock(int(f.Fd()), unix.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(short(t), blockSpec("pvc-locked")); err != nil {
		t.Fatalf("Create once the lock is free: %v", err)
	}
}

func TestNodes(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()

	_, err := s.Node(ctx, "node-1")
	testutil.WantKind(t, err, errdefs.ErrNotFound, "node-1", "loop/test", "registered")

	at := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	if err := s.RegisterNode(ctx, backend.NodeInfo{NodeID: "node-1", MaxVolumesPerNode: 16, RegisteredAt: at}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Node(ctx, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if got.NodeID != "node-1" || got.MaxVolumesPerNode != 16 || !got.RegisteredAt.Equal(at) {
		t.Fatalf("Node = %+v", got)
	}
	path := filepath.Join(s.Dir(), nodesDir, "node-1.json")
	if m := stat(t, path).Mode().Perm(); m != 0o600 {
		t.Fatalf("node record mode = %v, want 0600", m)
	}

	// A restart with the same information does not rewrite the record.
	before := stat(t, path)
	if err := s.RegisterNode(ctx, backend.NodeInfo{NodeID: "node-1", MaxVolumesPerNode: 16}); err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, stat(t, path)) {
		t.Fatal("re-registering unchanged information rewrote the record")
	}
	// A changed limit does.
	if err := s.RegisterNode(ctx, backend.NodeInfo{NodeID: "node-1", MaxVolumesPerNode: 32}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Node(ctx, "node-1"); err != nil || got.MaxVolumesPerNode != 32 {
		t.Fatalf("Node after the change = %+v, %v", got, err)
	}
	noTempFiles(t, s)

	for _, bad := range []string{"", "a/b", ".hidden", strings.Repeat("n", 201)} {
		testutil.WantKind(t, s.RegisterNode(ctx, backend.NodeInfo{NodeID: bad}), errdefs.ErrInvalidArgument)
		_, err := s.Node(ctx, bad)
		testutil.WantKind(t, err, errdefs.ErrInvalidArgument)
	}
}

func TestProvisionedBytes(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	for i, size := range []int64{mib, 3 * mib} {
		spec := blockSpec(fmt.Sprintf("pvc-%d", i))
		spec.CapacityBytes = size
		if _, err := s.Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	// Neither temporaries nor hidden files count.
	if err := os.WriteFile(filepath.Join(s.Dir(), atomicfile.TempPrefix+"pvc-9.json-123"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := s.ProvisionedBytes(); err != nil || n != 4*mib {
		t.Fatalf("ProvisionedBytes = %d, %v; want %d", n, err, 4*mib)
	}
	if free, err := s.FreeBytes(); err != nil || free <= 0 {
		t.Fatalf("FreeBytes = %d, %v", free, err)
	}
}

func TestCreateBiggerThanFreeSpace(t *testing.T) {
	s := newStore(t)
	free, err := s.FreeBytes()
	if err != nil {
		t.Fatal(err)
	}
	spec := blockSpec("pvc-huge")
	spec.CapacityBytes = free + 1<<30
	_, err = s.Create(t.Context(), spec)
	testutil.WantKind(t, err, errdefs.ErrExhausted, "loop/test")
	for _, p := range []string{s.metaPath("pvc-huge"), s.ImagePath("pvc-huge")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("a refused Create left %s: %v", p, err)
		}
	}
}

// TestRecordOfAnotherName: an image ID whose record names another volume
// (a hash collision, or a record copied in by hand) is never handed out for
// this name, and is left alone.
func TestRecordOfAnotherName(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	if _, err := s.Create(ctx, blockSpec("pvc-a")); err != nil {
		t.Fatal(err)
	}
	rec, err := s.read("pvc-a")
	if err != nil {
		t.Fatal(err)
	}
	rec.Name = "someone-else"
	if err := s.write(rec); err != nil {
		t.Fatal(err)
	}
	before := stat(t, s.metaPath("pvc-a"))
	_, err = s.Create(ctx, blockSpec("pvc-a"))
	testutil.WantKind(t, err, errdefs.ErrAlreadyExists, "someone-else", `"pvc-a"`)
	if !os.SameFile(before, stat(t, s.metaPath("pvc-a"))) {
		t.Fatal("the other volume's record was rewritten")
	}
}

// A volume whose image file vanished is not "created" again: its data is
// gone, and an empty replacement under the same name would hide that.
func TestRepeatedCreateWithMissingImage(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	if _, err := s.Create(ctx, blockSpec("pvc-lost")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(s.ImagePath("pvc-lost")); err != nil {
		t.Fatal(err)
	}
	_, err := s.Create(ctx, blockSpec("pvc-lost"))
	testutil.WantKind(t, err, errdefs.ErrPrecondition, "pvc-lost", "missing")
	if _, err := os.Stat(s.ImagePath("pvc-lost")); !os.IsNotExist(err) {
		t.Fatalf("a new image was made in place of the lost one: %v", err)
	}
}
