// Package kms keeps the passphrases of encrypted volumes. Each encrypted
// volume (and each snapshot of one) has its own random passphrase, the
// LUKS2 key of its data; a KMS wraps it, and only the wrapped form is
// stored (in the image's metadata) or travels (in publish_context). The
// node unwraps it when it stages the volume and hands it to cryptsetup on
// stdin; the plaintext never reaches a log line, an error, a command line
// or the environment.
//
// Two kinds of KMS, chosen by the StorageClass's encryptionKMSID (the names
// ceph-csi uses):
//
//   - secrets (built in, the default when no encryptionKMSID is given):
//     the passphrase is wrapped with a key derived from a Kubernetes Secret
//     the CSI sidecars pass with each request (csi.storage.k8s.io/
//     provisioner-secret-name, node-stage-secret-name, ...), so encryption
//     needs no extra service.
//   - vaulttransit: HashiCorp Vault's transit engine (or OpenBao's) over its
//     HTTP API, one transit key per volume, deleted with the volume.
//
// A KMS configuration file (a ConfigMap, as ceph-csi's) maps each
// encryptionKMSID to its settings.
package kms

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// KMS wraps and unwraps the passphrases of encrypted volumes. owner names
// whose passphrase it is (the volume or snapshot ID): a wrapped passphrase
// unwraps only for its owner. secrets are the CSI request's secrets.
type KMS interface {
	// ID is the encryptionKMSID the KMS is configured under.
	ID() string
	// String names the KMS for messages: "kms vault-a (Vault transit at
	// http://127.0.0.1:8200)". Every error of the KMS starts with it.
	String() string
	// Wrap wraps passphrase for owner, creating owner's key first where the
	// KMS keeps one per owner.
	Wrap(ctx context.Context, owner string, passphrase []byte, secrets map[string]string) (string, error)
	// Unwrap returns owner's passphrase from its wrapped form; the caller
	// clears it after use.
	Unwrap(ctx context.Context, owner, wrapped string, secrets map[string]string) ([]byte, error)
	// Forget destroys what the KMS keeps for owner, so no wrapped copy of
	// its passphrase unwraps again. Nothing kept is success.
	Forget(ctx context.Context, owner string, secrets map[string]string) error
}

// passphraseBytes is the randomness of a volume passphrase: 256 bits,
// hex-encoded, so it is text cryptsetup reads from a key file as it is.
const passphraseBytes = 32

// NewPassphrase returns a fresh random passphrase.
func NewPassphrase() ([]byte, error) {
	raw := make([]byte, passphraseBytes)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("generate a volume passphrase: %w", err)
	}
	out := make([]byte, hex.EncodedLen(len(raw)))
	hex.Encode(out, raw)
	clear(raw)
	return out, nil
}

// Types of KMS in the configuration's encryptionKMSType.
const (
	TypeSecrets      = "secrets"
	TypeVaultTransit = "vaulttransit"
)

// DefaultID is the built-in secrets KMS, used when a StorageClass asks for
// encryption without an encryptionKMSID.
const DefaultID = "secrets"

// Settings is one entry of the KMS configuration file.
type Settings struct {
	Type string `json:"encryptionKMSType"`
	// secrets: the key of the request secret whose value the wrapping key
	// is derived from (default encryptionPassphrase, ceph-csi's name).
	SecretKey string `json:"secretKey,omitempty"`
	// vaulttransit
	VaultAddress string `json:"vaultAddress,omitempty"`
	// VaultTransitPath is where the transit engine is mounted (default transit).
	VaultTransitPath string `json:"vaultTransitPath,omitempty"`
	VaultNamespace   string `json:"vaultNamespace,omitempty"`
	// VaultTokenFile holds the Vault token (a mounted Secret); without it
	// the request secret vaultToken is used.
	VaultTokenFile string `json:"vaultTokenFile,omitempty"`
	// VaultCAFile verifies an https vaultAddress.
	VaultCAFile string `json:"vaultCAFile,omitempty"`
	// VaultTimeout bounds each call (default 10s).
	VaultTimeout string `json:"vaultTimeout,omitempty"`
	// VaultKeyPrefix starts the name of every transit key (default spindle-).
	VaultKeyPrefix string `json:"vaultKeyPrefix,omitempty"`
}

// Registry is the configured KMSs by encryptionKMSID, with the built-in
// secrets KMS under DefaultID unless the file configures that ID itself.
type Registry struct {
	kms map[string]KMS
}

var idRe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)

// maxConfigBytes bounds the configuration file.
const maxConfigBytes = 1 << 20

// Load reads the configuration file at path ("" or a missing file: only
// the built-in secrets KMS).
func Load(path string) (*Registry, error) {
	settings := map[string]Settings{}
	if path != "" {
		data, err := os.ReadFile(path)
		switch {
		case os.IsNotExist(err):
		case err != nil:
			return nil, fmt.Errorf("KMS configuration %s: %w", path, err)
		case len(data) > maxConfigBytes:
			return nil, fmt.Errorf("KMS configuration %s is %d bytes; the most read is %d", path, len(data), maxConfigBytes)
		default:
			dec := json.NewDecoder(strings.NewReader(string(data)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&settings); err != nil {
				return nil, fmt.Errorf("KMS configuration %s: %w", path, err)
			}
		}
	}
	return NewRegistry(settings)
}

// NewRegistry builds the KMSs of settings.
func NewRegistry(settings map[string]Settings) (*Registry, error) {
	r := &Registry{kms: map[string]KMS{}}
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for id := range settings {
			if !yield(id) {
				return
			}
		}
	}) {
		if !idRe.MatchString(id) {
			return nil, fmt.Errorf("KMS configuration: %q is not a valid encryptionKMSID (letters, digits, '.', '_', '-'; at most 63)", id)
		}
		k, err := newKMS(id, settings[id])
		if err != nil {
			return nil, fmt.Errorf("KMS configuration: %s: %w", id, err)
		}
		r.kms[id] = k
	}
	if _, ok := r.kms[DefaultID]; !ok {
		r.kms[DefaultID] = newSecretsKMS(DefaultID, "")
	}
	return r, nil
}

func newKMS(id string, s Settings) (KMS, error) {
	switch s.Type {
	case TypeSecrets:
		return newSecretsKMS(id, s.SecretKey), nil
	case TypeVaultTransit:
		return newVaultTransit(id, s)
	case "":
		return nil, fmt.Errorf("encryptionKMSType is required (%s or %s)", TypeSecrets, TypeVaultTransit)
	}
	return nil, fmt.Errorf("encryptionKMSType %q is not one Spindle knows (%s, %s)", s.Type, TypeSecrets, TypeVaultTransit)
}

// Get returns the KMS configured under id ("" is DefaultID); an unknown ID
// is ErrInvalidArgument naming the configured ones.
func (r *Registry) Get(id string) (KMS, error) {
	if id == "" {
		id = DefaultID
	}
	if k, ok := r.kms[id]; ok {
		return k, nil
	}
	return nil, errdefs.InvalidArgument("encryptionKMSID %q is not configured (configured: %s); add it to the KMS configuration", id, strings.Join(r.IDs(), ", "))
}

// IDs lists the configured encryptionKMSIDs, sorted.
func (r *Registry) IDs() []string {
	ids := make([]string, 0, len(r.kms))
	for id := range r.kms {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// keyName is the name of owner's key in a KMS that keeps one per owner:
// readable (the volume ID, '/' as '.'), and unique through a hash of the
// ID, since '.' may be in an ID too.
func keyName(prefix, owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return prefix + strings.ReplaceAll(owner, "/", ".") + "-" + hex.EncodeToString(sum[:4])
}

// defaultTimeout bounds one call to a KMS.
const defaultTimeout = 10 * time.Second
