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
)

var testSecrets = map[string]string{DefaultSecretKey: "a Kubernetes Secret of at least 16 bytes"}

func TestNewPassphrase(t *testing.T) {
	a, err := NewPassphrase()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewPassphrase()
	if len(a) != 64 || bytes.Equal(a, b) || bytes.ContainsAny(a, "\n\x00") {
		t.Fatalf("passphrases %q, %q: want 64 hex characters, different each time", a, b)
	}
}

// The built-in KMS: a wrapped passphrase unwraps only for its owner and
// only with the Secret it was wrapped with; no error holds key material.
func TestSecretsKMS(t *testing.T) {
	reg, err := NewRegistry(nil)
	if err != nil {
		t.Fatal(err)
	}
	k, err := reg.Get("")
	if err != nil || k.ID() != DefaultID {
		t.Fatalf("Get(\"\") = %v, %v; want the built-in secrets KMS", k, err)
	}
	ctx := context.Background()
	pass, _ := NewPassphrase()
	const owner = "loop/default/pvc-1"
	wrapped, err := k.Wrap(ctx, owner, pass, testSecrets)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(wrapped, secretsPrefix) || strings.Contains(wrapped, string(pass)) {
		t.Fatalf("wrapped %q", wrapped)
	}
	again, _ := k.Wrap(ctx, owner, pass, testSecrets)
	if again == wrapped {
		t.Fatal("two wraps of one passphrase are equal: no fresh salt and nonce")
	}
	got, err := k.Unwrap(ctx, owner, wrapped, testSecrets)
	if err != nil || !bytes.Equal(got, pass) {
		t.Fatalf("Unwrap = %q, %v", got, err)
	}
	for _, tc := range []struct {
		name    string
		owner   string
		wrapped string
		secrets map[string]string
		want    string
	}{
		{"another owner", "loop/default/pvc-2", wrapped, testSecrets, "does not unwrap with secret encryptionPassphrase"},
		{"another secret", owner, wrapped, map[string]string{DefaultSecretKey: "another Secret, 16 bytes or more"}, "does not unwrap"},
		{"no secret", owner, wrapped, nil, "the request carries no secret encryptionPassphrase"},
		{"short secret", owner, wrapped, map[string]string{DefaultSecretKey: "short"}, "at least 16 are needed"},
		{"damaged", owner, wrapped[:len(wrapped)-8], testSecrets, "does not unwrap"},
		{"Vault's", owner, "vault:v1:abc", testSecrets, "was not made by a secrets KMS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := k.Unwrap(ctx, tc.owner, tc.wrapped, tc.secrets)
			if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "kms secrets (Kubernetes Secret key encryptionPassphrase)") {
				t.Fatalf("Unwrap = %v; want a precondition naming the KMS and %q", err, tc.want)
			}
			if strings.Contains(err.Error(), string(pass)) || strings.Contains(err.Error(), testSecrets[DefaultSecretKey]) {
				t.Fatalf("the error holds key material: %v", err)
			}
		})
	}
	if err := k.Forget(ctx, owner, testSecrets); err != nil {
		t.Fatal(err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(content string) string {
		path := filepath.Join(dir, "config.json")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	reg, err := Load(write(`{
	  "vault-a": {"encryptionKMSType": "vaulttransit", "vaultAddress": "http://127.0.0.1:8200", "vaultTransitPath": "/transit/"},
	  "tenant-b": {"encryptionKMSType": "secrets", "secretKey": "kek"}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(reg.IDs(), ","); got != "secrets,tenant-b,vault-a" {
		t.Fatalf("IDs = %s", got)
	}
	v, _ := reg.Get("vault-a")
	if v.String() != "kms vault-a (Vault transit at http://127.0.0.1:8200, path transit)" {
		t.Fatalf("String = %s", v)
	}
	_, err = reg.Get("nope")
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `encryptionKMSID "nope" is not configured (configured: secrets, tenant-b, vault-a)`) {
		t.Fatalf("Get(nope) = %v", err)
	}
	if reg, err := Load(filepath.Join(dir, "missing.json")); err != nil || len(reg.IDs()) != 1 {
		t.Fatalf("Load(missing) = %v, %v; want the built-in KMS only", reg, err)
	}
	for _, bad := range []struct{ content, want string }{
		{`{"a": {"encryptionKMSType": "aws"}}`, `encryptionKMSType "aws" is not one Spindle knows`},
		{`{"a": {}}`, "encryptionKMSType is required"},
		{`{"a": {"encryptionKMSType": "vaulttransit"}}`, "vaultAddress is required"},
		{`{"a": {"encryptionKMSType": "vaulttransit", "vaultAddress": "ftp://x"}}`, "is not an http or https URL"},
		{`{"a": {"encryptionKMSType": "vaulttransit", "vaultAddress": "http://x", "vaultTimeout": "-1s"}}`, "not a positive duration"},
		{`{"a b": {"encryptionKMSType": "secrets"}}`, "is not a valid encryptionKMSID"},
		{`{"a": {"encryptionKMSType": "secrets", "vaultAdress": "typo"}}`, `unknown field "vaultAdress"`},
	} {
		if _, err := Load(write(bad.content)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Load(%s) = %v, want %q", bad.content, err, bad.want)
		}
	}
}

// A Vault that does not answer: UNAVAILABLE, naming the KMS and where it is.
func TestVaultUnreachable(t *testing.T) {
	v, err := newVaultTransit("vault-a", Settings{Type: TypeVaultTransit, VaultAddress: "http://127.0.0.1:1", VaultTimeout: "2s"})
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{vaultTokenSecret: "s.token"}
	_, err = v.Unwrap(context.Background(), "loop/default/pvc-1", "vault:v1:abc", secrets)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "kms vault-a (Vault transit at http://127.0.0.1:1, path transit) is unreachable") {
		t.Fatalf("Unwrap = %v", err)
	}
	if strings.Contains(err.Error(), "s.token") {
		t.Fatalf("the error holds the token: %v", err)
	}
	_, err = v.Unwrap(context.Background(), "loop/default/pvc-1", "vault:v1:abc", nil)
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "no Vault token") {
		t.Fatalf("Unwrap without a token = %v", err)
	}
}

func TestKeyName(t *testing.T) {
	a := keyName("spindle-", "rbd/ceph-a/kube/csi-vol-1")
	b := keyName("spindle-", "rbd/ceph-a/kube.csi-vol-1")
	if !strings.HasPrefix(a, "spindle-rbd.ceph-a.kube.csi-vol-1-") || a == b {
		t.Fatalf("keyName = %s, %s", a, b)
	}
}
