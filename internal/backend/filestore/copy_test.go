package filestore

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// extent is data written at an offset of a test image.
type extent struct {
	off  int64
	data []byte
}

// sourceExtents are two data extents far apart, so a copy that fills the
// hole between them is caught.
var sourceExtents = []extent{
	{0, bytes.Repeat([]byte("first extent "), 80_000)},        // about 1 MiB
	{40 * mib, bytes.Repeat([]byte("second extent "), 5_000)}, // about 68 KiB
}

func writeExtents(t *testing.T, path string, extents []extent) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, e := range extents {
		if _, err := f.WriteAt(e.data, e.off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// sameContent fails unless the two files hold the same bytes up to n.
func sameContent(t *testing.T, a, b string, n int64) {
	t.Helper()
	da, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	db, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(da)) < n || int64(len(db)) < n || !bytes.Equal(da[:n], db[:n]) {
		t.Fatalf("%s (%d bytes) and %s (%d bytes) differ in their first %d bytes", a, len(da), b, len(db), n)
	}
}

// dataExtentAt reports where the next data at or after off starts (SEEK_DATA),
// or -1 when only a hole follows.
func dataExtentAt(t *testing.T, path string, off int64) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pos, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	if err == unix.ENXIO {
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	return pos
}

// TestSparseCopyKeepsHoles copies only the data: the copy has the same
// bytes, its holes where the source has them, and no more allocated than
// the source's data. A zeroed block that the source has allocated stays a
// hole in the copy.
func TestSparseCopyKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src.img"), filepath.Join(dir, "dst.img")
	const size = 64 * mib
	if err := os.WriteFile(src, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(src, size); err != nil {
		t.Fatal(err)
	}
	zeros := extent{20 * mib, make([]byte, mib)} // allocated, but all zeros
	writeExtents(t, src, append([]extent{zeros}, sourceExtents...))

	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := sparseCopy(t.Context(), out, in, size); err != nil {
		t.Fatal(err)
	}
	if err := out.Sync(); err != nil {
		t.Fatal(err)
	}

	sameContent(t, src, dst, size)
	if fi := stat(t, dst); fi.Size() != size {
		t.Fatalf("copy is %d bytes, want %d", fi.Size(), size)
	}
	var data int64
	for _, e := range sourceExtents {
		data += int64(len(e.data))
	}
	// A block of slack per extent: extents end mid-block.
	if got := allocated(t, dst); got > data+int64(len(sourceExtents))*64<<10 {
		t.Fatalf("the copy has %d bytes allocated for %d bytes of data; holes were filled", got, data)
	}
	if srcAlloc, dstAlloc := allocated(t, src), allocated(t, dst); dstAlloc >= srcAlloc {
		t.Fatalf("the copy has %d bytes allocated, the source %d; the zeroed megabyte was copied", dstAlloc, srcAlloc)
	}
	// The hole between the extents is a hole in the copy.
	if got := dataExtentAt(t, dst, 2*mib); got != sourceExtents[1].off {
		t.Fatalf("the next data after 2 MiB in the copy is at %d, want %d", got, sourceExtents[1].off)
	}
}

// TestSparseCopyCancelled stops between chunks when the context ends.
func TestSparseCopyCancelled(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src.img")
	if err := os.WriteFile(src, bytes.Repeat([]byte{1}, 4*copyChunk), 0o600); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(filepath.Join(dir, "dst.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := sparseCopy(ctx, out, in, 4*copyChunk); err != context.Canceled {
		t.Fatalf("sparseCopy with a cancelled context = %v, want %v", err, context.Canceled)
	}
}

// publishTo records an attachment the way the loop exporter does.
func publishTo(t *testing.T, s *Store, id, node string) {
	t.Helper()
	_, err := s.Update(t.Context(), id, func(img *backend.Image) error {
		img.Attachments = append(img.Attachments, backend.Attachment{NodeID: node, AccessMode: backend.SingleNodeWriter, Since: time.Now()})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func unpublish(t *testing.T, s *Store, id string) {
	t.Helper()
	if _, err := s.Update(t.Context(), id, func(img *backend.Image) error { img.Attachments = nil; return nil }); err != nil {
		t.Fatal(err)
	}
}

// TestCopyByPoolFilesystem runs clones and snapshots on pools of each kind
// of filesystem: xfs and btrfs reflink, and copy a volume in use at one
// instant; ext4 and tmpfs copy sparsely, and refuse to copy a volume that a
// node may be writing (the point-in-time rule) until it is unpublished.
func TestCopyByPoolFilesystem(t *testing.T) {
	tests := []struct {
		fstype string
		want   copyMethod
	}{
		{"xfs", copyReflink},
		{"btrfs", copyReflink},
		{"ext4", copySparse},
		{"tmpfs", copySparse},
	}
	for _, tt := range tests {
		t.Run(tt.fstype, func(t *testing.T) {
			pool := filepath.Join(scratchFS(t, tt.fstype, 0), "pool")
			s, err := New(Options{Dir: pool, Name: "loop/" + tt.fstype})
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			spec := blockSpec("pvc-source")
			spec.CapacityBytes = 48 * mib
			src, err := s.Create(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			writeExtents(t, s.ImagePath(src.ID), sourceExtents)

			// The method the pool's filesystem gets, and the hole kept.
			dst := filepath.Join(s.Dir(), "method-check.img")
			method, err := s.copyImage(ctx, dst, &copySource{what: "volume " + src.ID, path: s.ImagePath(src.ID), CopySource: backend.CopySource{SizeBytes: src.CapacityBytes}}, src.CapacityBytes)
			if err != nil {
				t.Fatal(err)
			}
			if method != tt.want {
				t.Fatalf("a copy on %s is a %s, want a %s", tt.fstype, method, tt.want)
			}
			sameContent(t, s.ImagePath(src.ID), dst, src.CapacityBytes)
			if got := dataExtentAt(t, dst, 2*mib); got != sourceExtents[1].off {
				t.Fatalf("the next data after 2 MiB in the %s is at %d, want %d: the hole was filled", method, got, sourceExtents[1].off)
			}
			if err := os.Remove(dst); err != nil {
				t.Fatal(err)
			}

			publishTo(t, s, src.ID, "node-busy")
			cloneSpec := blockSpec("pvc-clone")
			cloneSpec.CapacityBytes = 64 * mib
			cloneSpec.Source = &backend.ContentSource{ImageID: src.ID}
			snapSpec := backend.SnapshotSpec{Name: "snapshot-1", SourceImageID: src.ID}
			clone, cloneErr := s.Create(ctx, cloneSpec)
			snap, snapErr := s.CreateSnapshot(ctx, snapSpec)
			if tt.want == copySparse {
				for _, err := range []error{cloneErr, snapErr} {
					testutil.WantKind(t, err, errdefs.ErrPrecondition, src.ID, "node-busy", tt.fstype, "reflink", "point-in-time", "Unpublish")
				}
				if _, err := s.Get(ctx, ImageIDForName(cloneSpec.Name)); errdefs.KindOf(err) != errdefs.ErrNotFound {
					t.Fatalf("a refused clone left a volume: %v", err)
				}
				if _, err := os.Stat(s.ImagePath(ImageIDForName(cloneSpec.Name))); !os.IsNotExist(err) {
					t.Fatalf("a refused clone left its image: %v", err)
				}
				if snaps, err := s.ListSnapshots(ctx); err != nil || len(snaps) != 0 {
					t.Fatalf("a refused snapshot left %v, %v", snaps, err)
				}
				unpublish(t, s, src.ID)
				if clone, err = s.Create(ctx, cloneSpec); err != nil {
					t.Fatalf("clone once the source is unpublished: %v", err)
				}
				if snap, err = s.CreateSnapshot(ctx, snapSpec); err != nil {
					t.Fatalf("snapshot once the source is unpublished: %v", err)
				}
				// Restoring a snapshot is safe whatever its source is doing.
				publishTo(t, s, src.ID, "node-busy")
			} else if cloneErr != nil || snapErr != nil {
				t.Fatalf("on %s a published volume must be copied by reflink: clone %v, snapshot %v", tt.fstype, cloneErr, snapErr)
			}
			restoreSpec := blockSpec("pvc-restored")
			restoreSpec.CapacityBytes = src.CapacityBytes
			restoreSpec.Source = &backend.ContentSource{SnapshotID: snap.ID}
			restored, err := s.Create(ctx, restoreSpec)
			if err != nil {
				t.Fatalf("restore while the snapshot's source is published: %v", err)
			}

			for _, c := range []struct {
				path string
				size int64
			}{
				{s.ImagePath(clone.ID), cloneSpec.CapacityBytes},
				{s.snapshotImagePath(snap.ID), src.CapacityBytes},
				{s.ImagePath(restored.ID), restoreSpec.CapacityBytes},
			} {
				sameContent(t, s.ImagePath(src.ID), c.path, src.CapacityBytes)
				if fi := stat(t, c.path); fi.Size() != c.size {
					t.Fatalf("%s is %d bytes, want %d", c.path, fi.Size(), c.size)
				}
			}
			noTempFiles(t, s)
		})
	}
}

// TestCopyHoldsTheRecordedSize: an interrupted Expand leaves the source file
// longer than its record; a copy holds what the record says, then grows.
func TestCopyHoldsTheRecordedSize(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	src, err := s.Create(ctx, blockSpec("pvc-src"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(s.ImagePath(src.ID), 8*mib); err != nil {
		t.Fatal(err)
	}
	writeExtents(t, s.ImagePath(src.ID), []extent{{0, []byte("kept")}, {6 * mib, []byte("past the record")}})

	spec := blockSpec("pvc-clone")
	spec.CapacityBytes = 8 * mib
	spec.Source = &backend.ContentSource{ImageID: src.ID}
	clone, err := s.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(s.ImagePath(clone.ID))
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(data)) != 8*mib || string(data[:4]) != "kept" || !bytes.Equal(data[6*mib:6*mib+15], make([]byte, 15)) {
		t.Fatalf("the clone (%d bytes) starts %q and holds %q at 6 MiB; want the recorded 4 MiB, grown with zeros", len(data), data[:4], data[6*mib:6*mib+15])
	}
	snap, err := s.CreateSnapshot(ctx, backend.SnapshotSpec{Name: "snap", SourceImageID: src.ID})
	if err != nil {
		t.Fatal(err)
	}
	if fi := stat(t, s.snapshotImagePath(snap.ID)); fi.Size() != src.CapacityBytes || snap.SizeBytes != src.CapacityBytes {
		t.Fatalf("snapshot file %d bytes, SizeBytes %d; want the recorded %d", fi.Size(), snap.SizeBytes, src.CapacityBytes)
	}
}

func TestCloneRules(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	mount := backend.VolumeSpec{Name: "pvc-xfs", CapacityBytes: 4 * mib, AccessType: backend.AccessMount, FsType: "xfs"}
	src, err := s.Create(ctx, mount)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(ctx, src.ID, func(i *backend.Image) error { i.Formatted = true; return nil }); err != nil {
		t.Fatal(err)
	}
	from := &backend.ContentSource{ImageID: src.ID}
	tests := []struct {
		name     string
		spec     backend.VolumeSpec
		kind     error
		mentions []string
	}{
		{"fs type left to the source", backend.VolumeSpec{Name: "c1", CapacityBytes: 4 * mib, AccessType: backend.AccessMount, Source: from}, nil, nil},
		{"same fs type", backend.VolumeSpec{Name: "c2", CapacityBytes: 4 * mib, AccessType: backend.AccessMount, FsType: "xfs", Source: from}, nil, nil},
		{"other fs type", backend.VolumeSpec{Name: "c3", CapacityBytes: 4 * mib, AccessType: backend.AccessMount, FsType: "ext4", Source: from}, errdefs.ErrInvalidArgument, []string{"xfs", "ext4", src.ID}},
		{"block from mount", backend.VolumeSpec{Name: "c4", CapacityBytes: 4 * mib, AccessType: backend.AccessBlock, Source: from}, errdefs.ErrInvalidArgument, []string{"block", "mount"}},
		{"smaller", backend.VolumeSpec{Name: "c5", CapacityBytes: 2 * mib, AccessType: backend.AccessMount, Source: from}, errdefs.ErrOutOfRange, []string{"4194304", "2097152"}},
		{"missing volume", backend.VolumeSpec{Name: "c6", CapacityBytes: 4 * mib, AccessType: backend.AccessMount, Source: &backend.ContentSource{ImageID: "pvc-none"}}, errdefs.ErrNotFound, []string{"pvc-none"}},
		{"missing snapshot", backend.VolumeSpec{Name: "c7", CapacityBytes: 4 * mib, AccessType: backend.AccessMount, Source: &backend.ContentSource{SnapshotID: "snap-none"}}, errdefs.ErrNotFound, []string{"snap-none"}},
		{"empty source", backend.VolumeSpec{Name: "c8", CapacityBytes: 4 * mib, AccessType: backend.AccessMount, Source: &backend.ContentSource{}}, errdefs.ErrInvalidArgument, []string{"neither"}},
		{"bad source ID", backend.VolumeSpec{Name: "c9", CapacityBytes: 4 * mib, AccessType: backend.AccessMount, Source: &backend.ContentSource{ImageID: "../x"}}, errdefs.ErrInvalidArgument, []string{"../x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img, err := s.Create(ctx, tt.spec)
			if tt.kind != nil {
				testutil.WantKind(t, err, tt.kind, tt.mentions...)
				for _, p := range []string{s.ImagePath(ImageIDForName(tt.spec.Name)), s.metaPath(ImageIDForName(tt.spec.Name))} {
					if _, err := os.Stat(p); !os.IsNotExist(err) {
						t.Fatalf("a refused clone left %s", p)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if img.FsType != "xfs" || !img.Formatted || img.Source == nil || *img.Source != *from {
				t.Fatalf("clone = %+v; want xfs, formatted, from %s", img, src.ID)
			}
			// The repeat is the same volume, however it names the fs type.
			for _, fs := range []string{"", "xfs"} {
				again := tt.spec
				again.FsType = fs
				if _, err := s.Create(ctx, again); err != nil {
					t.Fatalf("repeated Create with fs type %q: %v", fs, err)
				}
			}
			again := tt.spec
			again.FsType = "ext4"
			_, err = s.Create(ctx, again)
			testutil.WantKind(t, err, errdefs.ErrAlreadyExists)
		})
	}
}

func TestSnapshotIDForName(t *testing.T) {
	for _, tt := range []struct {
		name string
		kept bool
	}{
		{"snapshot-6f1c2a9e-2b7d-4c1e-9a55-0d3f1e2b4c5d", true},
		{"Snapshot With Spaces", false},
		{"snap-" + strings.Repeat("ab", 20), false}, // looks like a hash
		{"vol-" + strings.Repeat("ab", 20), true},   // a volume hash is a plain snapshot name
	} {
		id := SnapshotIDForName(tt.name)
		if (id == tt.name) != tt.kept {
			t.Errorf("SnapshotIDForName(%q) = %q, kept %t; want kept %t", tt.name, id, id == tt.name, tt.kept)
		}
		if !tt.kept && !hashedSnapshotIDRe.MatchString(id) {
			t.Errorf("SnapshotIDForName(%q) = %q, want snap-<sha>", tt.name, id)
		}
		if err := validID(id); err != nil {
			t.Errorf("SnapshotIDForName(%q) = %q is not a valid name: %v", tt.name, id, err)
		}
	}
}

func TestSnapshotLifecycle(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	src, err := s.Create(ctx, blockSpec("pvc-src"))
	if err != nil {
		t.Fatal(err)
	}
	spec := backend.SnapshotSpec{Name: "snapshot-a", SourceImageID: src.ID}
	snap, err := s.CreateSnapshot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if m := stat(t, s.snapshotMetaPath(snap.ID)).Mode().Perm(); m != 0o600 {
		t.Fatalf("snapshot metadata mode = %v, want 0600", m)
	}

	t.Run("a volume and a snapshot may share an ID", func(t *testing.T) {
		vol := blockSpec(snap.Name)
		if _, err := s.Create(ctx, vol); err != nil {
			t.Fatal(err)
		}
		if got, err := s.GetSnapshot(ctx, snap.ID); err != nil || got.SourceImageID != src.ID {
			t.Fatalf("GetSnapshot = %+v, %v", got, err)
		}
	})

	t.Run("missing image file", func(t *testing.T) {
		if err := os.Rename(s.snapshotImagePath(snap.ID), s.snapshotImagePath(snap.ID)+".moved"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Rename(s.snapshotImagePath(snap.ID)+".moved", s.snapshotImagePath(snap.ID)) })
		_, err := s.CreateSnapshot(ctx, spec)
		testutil.WantKind(t, err, errdefs.ErrPrecondition, "missing")
	})

	t.Run("corrupt metadata is not missing", func(t *testing.T) {
		other, err := s.CreateSnapshot(ctx, backend.SnapshotSpec{Name: "snapshot-corrupt", SourceImageID: src.ID})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(s.snapshotMetaPath(other.ID), []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, getErr := s.GetSnapshot(ctx, other.ID)
		_, createErr := s.CreateSnapshot(ctx, backend.SnapshotSpec{Name: "snapshot-corrupt", SourceImageID: src.ID})
		_, listErr := s.ListSnapshots(ctx)
		for op, err := range map[string]error{"GetSnapshot": getErr, "CreateSnapshot": createErr, "ListSnapshots": listErr} {
			if err == nil || errdefs.KindOf(err) == errdefs.ErrNotFound || !strings.Contains(err.Error(), "corrupt") {
				t.Fatalf("%s over corrupt metadata = %v; want a corruption error", op, err)
			}
		}
		if _, err := os.Stat(s.snapshotImagePath(other.ID)); err != nil {
			t.Fatalf("the image behind corrupt metadata was touched: %v", err)
		}
		if err := s.DeleteSnapshot(ctx, other.ID); err != nil {
			t.Fatalf("DeleteSnapshot of a corrupt record: %v", err)
		}
	})

	t.Run("invalid IDs", func(t *testing.T) {
		for _, id := range []string{"", "../x", "a/b", ".hidden"} {
			_, err := s.GetSnapshot(ctx, id)
			testutil.WantKind(t, err, errdefs.ErrInvalidArgument)
			testutil.WantKind(t, s.DeleteSnapshot(ctx, id), errdefs.ErrInvalidArgument)
			_, err = s.CreateSnapshot(ctx, backend.SnapshotSpec{Name: "x", SourceImageID: id})
			testutil.WantKind(t, err, errdefs.ErrInvalidArgument)
		}
		_, err := s.CreateSnapshot(ctx, backend.SnapshotSpec{SourceImageID: src.ID})
		testutil.WantKind(t, err, errdefs.ErrInvalidArgument, "name")
	})

	t.Run("deleting the source keeps the snapshot", func(t *testing.T) {
		if err := s.Delete(ctx, src.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(s.snapshotImagePath(snap.ID)); err != nil {
			t.Fatalf("the snapshot's image went with its source: %v", err)
		}
		// The same name, asked again of the deleted source, is still that snapshot.
		if again, err := s.CreateSnapshot(ctx, spec); err != nil || again.ID != snap.ID {
			t.Fatalf("repeated CreateSnapshot after the source was deleted = %+v, %v", again, err)
		}
	})
	noTempFiles(t, s)
}

// TestSweepSnapshots: opening a store removes what an interrupted snapshot
// left (an image without a record, temporaries) and keeps real snapshots.
func TestSweepSnapshots(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	src, err := s.Create(ctx, blockSpec("pvc-src"))
	if err != nil {
		t.Fatal(err)
	}
	kept, err := s.CreateSnapshot(ctx, backend.SnapshotSpec{Name: "snapshot-kept", SourceImageID: src.ID})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(s.Dir(), snapshotsDir)
	leftovers := []string{filepath.Join(dir, "snapshot-half.img"), filepath.Join(dir, ".tmp-snapshot-x.json-123")}
	for _, p := range leftovers {
		if err := os.WriteFile(p, []byte("left over"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := New(Options{Dir: s.Dir(), Name: "loop/test"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range leftovers {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s survived opening the store: %v", p, err)
		}
	}
	if _, err := s.GetSnapshot(ctx, kept.ID); err != nil {
		t.Fatalf("a real snapshot did not survive opening the store: %v", err)
	}
	if _, err := os.Stat(s.snapshotImagePath(kept.ID)); err != nil {
		t.Fatal(err)
	}
}

// TestCopySpaceCheck: a sparse copy needs the source's allocated bytes free.
func TestCopySpaceCheck(t *testing.T) {
	pool := filepath.Join(scratchFS(t, "tmpfs", 64*mib), "pool")
	s, err := New(Options{Dir: pool, Name: "loop/small"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	spec := blockSpec("pvc-full")
	spec.CapacityBytes = 48 * mib
	src, err := s.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	// 40 MiB of data on a 64 MiB tmpfs: a second copy cannot fit.
	writeExtents(t, s.ImagePath(src.ID), []extent{{0, bytes.Repeat([]byte{7}, 40*int(mib))}})
	before := listDir(t, s.Dir())
	_, err = s.CreateSnapshot(ctx, backend.SnapshotSpec{Name: "snapshot-big", SourceImageID: src.ID})
	testutil.WantKind(t, err, errdefs.ErrExhausted, "loop/small")
	if after := listDir(t, s.Dir()); strings.Join(before, ",") != strings.Join(after, ",") {
		t.Fatalf("a refused snapshot changed the pool:\nbefore %v\nafter  %v", before, after)
	}
}

// listDir lists every file under dir (relative), for before/after comparisons.
func listDir(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
