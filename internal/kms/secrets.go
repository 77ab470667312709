package kms

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// secretsKMS wraps a passphrase with AES-256-GCM under a key derived
// (PBKDF2-SHA256, a fresh salt per wrap) from one value of the request's
// Kubernetes Secret. The wrapped form names its owner as additional data,
// so a wrapped passphrase copied onto another volume does not unwrap.
// What it keeps is the wrapped passphrase itself, in the image's
// metadata: deleting the image forgets it.
type secretsKMS struct {
	id, secretKey string
}

// DefaultSecretKey is the request secret the built-in KMS derives its key
// from (ceph-csi's name for it).
const DefaultSecretKey = "encryptionPassphrase"

// secretsPrefix starts every passphrase the secrets KMS wrapped.
const secretsPrefix = "spindle-secrets-v1:"

const (
	kdfIterations = 210000 // OWASP's figure for PBKDF2-HMAC-SHA256
	saltBytes     = 16
	// minSecretBytes: a shorter secret is refused; the wrapping is no
	// stronger than the secret.
	minSecretBytes = 16
)

func newSecretsKMS(id, secretKey string) *secretsKMS {
	if secretKey == "" {
		secretKey = DefaultSecretKey
	}
	return &secretsKMS{id: id, secretKey: secretKey}
}

func (k *secretsKMS) ID() string { return k.id }

func (k *secretsKMS) String() string {
	return fmt.Sprintf("kms %s (Kubernetes Secret key %s)", k.id, k.secretKey)
}

// aead derives the wrapping key from the request secret and salt.
func (k *secretsKMS) aead(secrets map[string]string, salt []byte) (cipher.AEAD, error) {
	secret, ok := secrets[k.secretKey]
	switch {
	case !ok:
		return nil, errdefs.Precondition("%s: the request carries no secret %s; name a Secret holding it in the StorageClass (csi.storage.k8s.io/provisioner-secret-name, node-stage-secret-name, snapshotter-secret-name)", k, k.secretKey)
	case len(secret) < minSecretBytes:
		return nil, errdefs.Precondition("%s: secret %s is %d bytes; at least %d are needed", k, k.secretKey, len(secret), minSecretBytes)
	}
	key, err := pbkdf2.Key(sha256.New, secret, salt, kdfIterations, 32)
	if err != nil {
		return nil, fmt.Errorf("%s: derive the wrapping key: %w", k, err)
	}
	defer clear(key)
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func additionalData(owner string) []byte { return []byte("spindle volume passphrase of " + owner) }

func (k *secretsKMS) Wrap(_ context.Context, owner string, passphrase []byte, secrets map[string]string) (string, error) {
	salt := make([]byte, saltBytes)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	gcm, err := k.aead(secrets, salt)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, gcm.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	sealed := gcm.Seal(append(append([]byte{}, salt...), nonce...), nonce, passphrase, additionalData(owner))
	return secretsPrefix + base64.RawStdEncoding.EncodeToString(sealed), nil
}

func (k *secretsKMS) Unwrap(_ context.Context, owner, wrapped string, secrets map[string]string) ([]byte, error) {
	encoded, ok := strings.CutPrefix(wrapped, secretsPrefix)
	if !ok {
		return nil, errdefs.Precondition("%s: the wrapped key of %s was not made by a secrets KMS", k, owner)
	}
	sealed, err := base64.RawStdEncoding.DecodeString(encoded)
	if err != nil || len(sealed) < saltBytes+12+16 {
		return nil, errdefs.Precondition("%s: the wrapped key of %s is damaged", k, owner)
	}
	gcm, err := k.aead(secrets, sealed[:saltBytes])
	if err != nil {
		return nil, err
	}
	nonce := sealed[saltBytes : saltBytes+gcm.NonceSize()]
	plain, err := gcm.Open(nil, nonce, sealed[saltBytes+gcm.NonceSize():], additionalData(owner))
	if err != nil {
		return nil, errdefs.Precondition("%s: the wrapped key of %s does not unwrap with secret %s (is it another Secret than the one it was wrapped with?)", k, owner, k.secretKey)
	}
	return plain, nil
}

// Forget implements KMS: the secrets KMS keeps nothing of its own.
func (k *secretsKMS) Forget(context.Context, string, map[string]string) error { return nil }
