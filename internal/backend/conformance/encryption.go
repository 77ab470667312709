package conformance

import (
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// testEncryption: every backend keeps an encrypted volume's wrapped key
// with its image and lets a key rotation change it in place (the driver
// offers encryption on every backend, so a store without SetEncryption
// would refuse rotate-key only once a volume is in use).
func testEncryption(t *testing.T, newFixture Factory) {
	h := newHarness(t, newFixture, Options{})
	keeper, ok := h.store().(backend.EncryptionKeeper)
	if !ok {
		t.Fatalf("the store (%T) cannot change an image's key: key rotation would be refused", h.store())
	}
	spec := mountSpec("pvc-conformance-encrypted")
	spec.Encryption = &backend.Encryption{KMSID: "secrets", KeyOwner: "volume/pvc-conformance-encrypted", WrappedKey: "wrapped-1"}
	img := h.create(spec)
	for _, i := range []*backend.Image{img, h.get(img.ID)} {
		if i.Encryption == nil || *i.Encryption != *spec.Encryption {
			t.Fatalf("the image keeps Encryption %+v, want %+v", i.Encryption, spec.Encryption)
		}
	}
	rotating := &backend.Encryption{KMSID: "secrets", KeyOwner: spec.Encryption.KeyOwner, WrappedKey: "wrapped-1", NextWrappedKey: "wrapped-2"}
	rotated := &backend.Encryption{KMSID: "secrets", KeyOwner: spec.Encryption.KeyOwner, WrappedKey: "wrapped-2", PreviousWrappedKey: "wrapped-1"}
	for _, e := range []*backend.Encryption{rotating, rotated} {
		if err := keeper.SetEncryption(h.ctx, img.ID, e); err != nil {
			t.Fatalf("SetEncryption(%+v): %v", e, err)
		}
		got := h.get(img.ID)
		if got.Encryption == nil || *got.Encryption != *e {
			t.Fatalf("after SetEncryption the image keeps %+v, want %+v", got.Encryption, e)
		}
		checkImage(t, "after SetEncryption", got, spec)
	}
	missing := h.missingID()
	testutil.WantKind(t, keeper.SetEncryption(h.ctx, missing, rotated), errdefs.ErrNotFound)
}
