package kms

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/kms/kmstest"
)

// Vault's transit engine, for real: a passphrase wrapped and unwrapped
// through a per-volume transit key, the key deleted with the volume, and
// a stopped Vault answered UNAVAILABLE naming it.
func TestVaultTransitRealServer(t *testing.T) {
	v := kmstest.StartVault(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(v.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reg, err := NewRegistry(map[string]Settings{"vault-test": {Type: TypeVaultTransit, VaultAddress: v.Addr, VaultTokenFile: tokenFile, VaultTimeout: "5s"}})
	if err != nil {
		t.Fatal(err)
	}
	k, _ := reg.Get("vault-test")
	ctx := context.Background()
	const owner, other = "loop/default/pvc-vault", "loop/default/pvc-other"
	pass, _ := NewPassphrase()
	wrapped, err := k.Wrap(ctx, owner, pass, nil)
	if err != nil {
		t.Fatalf("Wrap: %v\n%s", err, v.Log())
	}
	if !strings.HasPrefix(wrapped, "vault:v1:") || strings.Contains(wrapped, string(pass)) {
		t.Fatalf("wrapped %q", wrapped)
	}
	if !v.TransitKeyExists(t, keyName("spindle-", owner)) {
		t.Fatal("no transit key was made for the volume")
	}
	got, err := k.Unwrap(ctx, owner, wrapped, nil)
	if err != nil || !bytes.Equal(got, pass) {
		t.Fatalf("Unwrap = %q, %v", got, err)
	}
	// Another volume's key does not open this one's wrapped passphrase.
	if _, err := k.Wrap(ctx, other, pass, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Unwrap(ctx, other, wrapped, nil); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("Unwrap with another volume's key = %v; want a refusal", err)
	}
	// A wrong token is a refusal naming the KMS, not an outage.
	if err := os.WriteFile(tokenFile, []byte("s.wrong"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = k.Unwrap(ctx, owner, wrapped, nil)
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "kms vault-test") || !strings.Contains(err.Error(), "HTTP 403") {
		t.Fatalf("Unwrap with a wrong token = %v", err)
	}
	if err := os.WriteFile(tokenFile, []byte(v.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	// Deleting the volume deletes its key: the wrapped copy is useless.
	for i := 0; i < 2; i++ { // the second is a retried DeleteVolume
		if err := k.Forget(ctx, owner, nil); err != nil {
			t.Fatalf("Forget #%d: %v", i+1, err)
		}
	}
	if v.TransitKeyExists(t, keyName("spindle-", owner)) {
		t.Fatal("the transit key is still there after Forget")
	}
	if _, err := k.Unwrap(ctx, owner, wrapped, nil); err == nil {
		t.Fatal("a forgotten volume's passphrase still unwraps")
	}
	// Vault stopped: UNAVAILABLE, naming it.
	v.Stop()
	_, err = k.Unwrap(ctx, other, wrapped, nil)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "kms vault-test (Vault transit at "+v.Addr) {
		t.Fatalf("Unwrap with Vault stopped = %v", err)
	}
	t.Logf("with Vault stopped: %v", err)
	if strings.Contains(err.Error(), v.Token) || strings.Contains(err.Error(), string(pass)) {
		t.Fatalf("the error holds a secret: %v", err)
	}
}
