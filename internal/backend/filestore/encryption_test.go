package filestore

import (
	"context"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
)

// The store keeps an encrypted volume's and snapshot's wrapped key as given,
// across a reopen of the pool, and a copy keeps the one its spec names.
func TestEncryptionKept(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	vol := &backend.Encryption{KMSID: "secrets", KeyOwner: "pvc-enc", WrappedKey: "spindle-secrets-v1:AAAA"}
	img, err := s.Create(ctx, backend.VolumeSpec{Name: "pvc-enc", CapacityBytes: 8 << 20, AccessType: backend.AccessBlock, Encryption: vol})
	if err != nil {
		t.Fatal(err)
	}
	snapKey := &backend.Encryption{KMSID: "secrets", KeyOwner: "snapshot/snap-enc", WrappedKey: "spindle-secrets-v1:BBBB"}
	snap, err := s.CreateSnapshot(ctx, backend.SnapshotSpec{Name: "snap-enc", SourceImageID: img.ID, Encryption: snapKey})
	if err != nil {
		t.Fatal(err)
	}
	restoredKey := &backend.Encryption{KMSID: "secrets", KeyOwner: "pvc-restored", WrappedKey: "spindle-secrets-v1:CCCC"}
	restored, err := s.Create(ctx, backend.VolumeSpec{Name: "pvc-restored", CapacityBytes: 8 << 20, AccessType: backend.AccessBlock,
		Source: &backend.ContentSource{SnapshotID: snap.ID}, Encryption: restoredKey})
	if err != nil {
		t.Fatal(err)
	}
	reopened, err := New(Options{Dir: s.dir, Name: s.name})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]*backend.Encryption{img.ID: vol, restored.ID: restoredKey} {
		got, err := reopened.Get(ctx, id)
		if err != nil || got.Encryption == nil || *got.Encryption != *want {
			t.Fatalf("Get(%s).Encryption = %+v, %v; want %+v", id, got.Encryption, err, want)
		}
	}
	gotSnap, err := reopened.GetSnapshot(ctx, snap.ID)
	if err != nil || gotSnap.Encryption == nil || *gotSnap.Encryption != *snapKey {
		t.Fatalf("GetSnapshot.Encryption = %+v, %v", gotSnap.Encryption, err)
	}
	// A retried create answers the key it was created with.
	again, err := s.Create(ctx, backend.VolumeSpec{Name: "pvc-enc", CapacityBytes: 8 << 20, AccessType: backend.AccessBlock,
		Encryption: &backend.Encryption{KMSID: "secrets", KeyOwner: "pvc-enc", WrappedKey: "another wrap"}})
	if err != nil || *again.Encryption != *vol {
		t.Fatalf("retried Create = %+v, %v; want the first key", again.Encryption, err)
	}
}

// A key rotation changes the wrapped key in place.
func TestSetEncryption(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	img, err := s.Create(ctx, backend.VolumeSpec{Name: "pvc-rotate", CapacityBytes: 8 << 20, AccessType: backend.AccessBlock,
		Encryption: &backend.Encryption{KMSID: "secrets", KeyOwner: "volume/pvc-rotate", WrappedKey: "old"}})
	if err != nil {
		t.Fatal(err)
	}
	next := &backend.Encryption{KMSID: "secrets", KeyOwner: "volume/pvc-rotate", WrappedKey: "old", NextWrappedKey: "new"}
	if err := s.SetEncryption(ctx, img.ID, next); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, img.ID)
	if err != nil || *got.Encryption != *next {
		t.Fatalf("after SetEncryption: %+v, %v", got.Encryption, err)
	}
	if err := s.SetEncryption(ctx, "missing", next); err == nil {
		t.Fatal("SetEncryption of a missing image succeeded")
	}
}
