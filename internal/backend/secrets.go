package backend

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
)

// Secrets are the CSI secrets of one request (csi.storage.k8s.io/*-secret-*
// in the StorageClass): CHAP credentials, cephx keys. They travel to the
// backend in the request's context rather than in every method's
// arguments, because only some backends need them and for only some calls.
//
// A Secrets value never prints its values: formatting it (%v, %s, %+v,
// %#v) or marshalling it shows the keys only, so a secret cannot reach a
// log line or an error message by accident.
type Secrets map[string]string

// String lists the keys only.
func (s Secrets) String() string {
	return redacted(sortedKeys(s))
}

// GoString is String, so %#v is safe too.
func (s Secrets) GoString() string { return s.String() }

// MarshalJSON writes the keys with redacted values.
func (s Secrets) MarshalJSON() ([]byte, error) {
	out := []byte{'{'}
	first := true
	for _, k := range sortedKeys(s) {
		if !first {
			out = append(out, ',')
		}
		first = false
		out = append(out, quote(k)...)
		out = append(out, []byte(`:"REDACTED"`)...)
	}
	return append(out, '}'), nil
}

type secretsKey struct{}

// WithSecrets returns ctx carrying a copy of secrets (nothing when empty).
func WithSecrets(ctx context.Context, secrets map[string]string) context.Context {
	if len(secrets) == 0 {
		return ctx
	}
	return context.WithValue(ctx, secretsKey{}, Secrets(maps.Clone(secrets)))
}

type secretsRequiredKey struct{}

// WithSecretsOnly returns ctx carrying a copy of secrets, marked so that
// the backend reaches its storage with those credentials only, never with
// an identity of its own configuration: for requests that come through an
// endpoint with no authentication of its own (adopt), the secrets are the
// caller's proof that it may act on the storage.
func WithSecretsOnly(ctx context.Context, secrets map[string]string) context.Context {
	return context.WithValue(WithSecrets(ctx, secrets), secretsRequiredKey{}, true)
}

// SecretsOnly reports whether ctx came from WithSecretsOnly.
func SecretsOnly(ctx context.Context) bool {
	only, _ := ctx.Value(secretsRequiredKey{}).(bool)
	return only
}

// SecretsFrom returns the request's secrets; nil when it has none.
func SecretsFrom(ctx context.Context) Secrets {
	s, _ := ctx.Value(secretsKey{}).(Secrets)
	return s
}

func sortedKeys(s Secrets) []string {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func redacted(keys []string) string {
	out := "Secrets{"
	for i, k := range keys {
		if i > 0 {
			out += ", "
		}
		out += k + ": REDACTED"
	}
	return out + "}"
}

func quote(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}
