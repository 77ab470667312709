package kms

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// vaultTransit wraps passphrases with Vault's transit engine: one
// aes256-gcm96 transit key per owner (volume or snapshot), created by
// Wrap and deleted by Forget, so deleting a volume destroys the only key
// that unwraps its passphrase. The wrapped form is Vault's ciphertext
// ("vault:v1:..."). It speaks Vault's HTTP API directly:
//
//	POST   /v1/<path>/keys/<name>          create (idempotent)
//	POST   /v1/<path>/encrypt/<name>       {"plaintext": base64}
//	POST   /v1/<path>/decrypt/<name>       {"ciphertext": ...}
//	POST   /v1/<path>/keys/<name>/config   {"deletion_allowed": true}
//	DELETE /v1/<path>/keys/<name>
type vaultTransit struct {
	id        string
	addr      *url.URL
	path      string
	namespace string
	tokenFile string
	prefix    string
	client    *http.Client
}

// vaultTokenSecret is the request secret that holds the Vault token when
// the configuration names no token file.
const vaultTokenSecret = "vaultToken"

// maxVaultResponse bounds what is read of one Vault answer.
const maxVaultResponse = 1 << 20

func newVaultTransit(id string, s Settings) (*vaultTransit, error) {
	if s.VaultAddress == "" {
		return nil, errors.New("vaultAddress is required")
	}
	addr, err := url.Parse(s.VaultAddress)
	if err != nil || (addr.Scheme != "http" && addr.Scheme != "https") || addr.Host == "" {
		return nil, fmt.Errorf("vaultAddress %q is not an http or https URL", s.VaultAddress)
	}
	timeout := defaultTimeout
	if s.VaultTimeout != "" {
		if timeout, err = time.ParseDuration(s.VaultTimeout); err != nil || timeout <= 0 {
			return nil, fmt.Errorf("vaultTimeout %q is not a positive duration", s.VaultTimeout)
		}
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.Proxy = nil // a KMS is reached directly, never through a proxy from the environment
	if s.VaultCAFile != "" {
		pem, err := os.ReadFile(s.VaultCAFile)
		if err != nil {
			return nil, fmt.Errorf("vaultCAFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("vaultCAFile %s holds no PEM certificate", s.VaultCAFile)
		}
		transport.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	path := strings.Trim(s.VaultTransitPath, "/")
	if path == "" {
		path = "transit"
	}
	prefix := s.VaultKeyPrefix
	if prefix == "" {
		prefix = "spindle-"
	}
	return &vaultTransit{
		id: id, addr: addr, path: path, namespace: s.VaultNamespace, tokenFile: s.VaultTokenFile, prefix: prefix,
		client: &http.Client{Timeout: timeout, Transport: transport},
	}, nil
}

func (v *vaultTransit) ID() string { return v.id }

func (v *vaultTransit) String() string {
	return fmt.Sprintf("kms %s (Vault transit at %s, path %s)", v.id, v.addr.Redacted(), v.path)
}

func (v *vaultTransit) token(secrets map[string]string) (string, error) {
	if v.tokenFile != "" {
		data, err := os.ReadFile(v.tokenFile)
		if err != nil {
			return "", errdefs.Wrap(errdefs.ErrPrecondition, err, "%s: read the Vault token", v)
		}
		if t := strings.TrimSpace(string(data)); t != "" {
			return t, nil
		}
		return "", errdefs.Precondition("%s: Vault token file %s is empty", v, v.tokenFile)
	}
	if t := secrets[vaultTokenSecret]; t != "" {
		return t, nil
	}
	return "", errdefs.Precondition("%s: no Vault token: the configuration names no vaultTokenFile and the request carries no secret %s", v, vaultTokenSecret)
}

// vaultError is Vault's error body.
type vaultError struct {
	Errors []string `json:"errors"`
}

// call sends one request; out, when non-nil, receives the answer's data.
// Errors name the KMS and the operation, never the body sent.
func (v *vaultTransit) call(ctx context.Context, method, op string, in, out any, secrets map[string]string) (int, error) {
	token, err := v.token(secrets)
	if err != nil {
		return 0, err
	}
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return 0, err
		}
		defer clear(data)
		body = bytes.NewReader(data)
	}
	u := v.addr.JoinPath("v1", v.path, op)
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Vault-Token", token)
	req.Header.Set("X-Vault-Request", "true")
	if v.namespace != "" {
		req.Header.Set("X-Vault-Namespace", v.namespace)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := v.client.Do(req)
	if err != nil {
		var netErr net.Error
		if errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return 0, errdefs.Wrap(errdefs.ErrUnavailable, err, "%s is unreachable (%s %s)", v, method, op)
		}
		return 0, errdefs.Wrap(errdefs.ErrUnavailable, err, "%s: %s %s", v, method, op)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxVaultResponse))
	if err != nil {
		return resp.StatusCode, errdefs.Wrap(errdefs.ErrUnavailable, err, "%s: %s %s: read the answer", v, method, op)
	}
	defer clear(data)
	if resp.StatusCode >= 300 {
		var ve vaultError
		_ = json.Unmarshal(data, &ve)
		msg := strings.Join(ve.Errors, "; ")
		if msg == "" {
			msg = http.StatusText(resp.StatusCode)
		}
		kind := errdefs.ErrPrecondition
		switch {
		case resp.StatusCode == http.StatusNotFound:
			kind = errdefs.ErrNotFound
		case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
			kind = errdefs.ErrUnavailable // sealed, standby, overloaded
		}
		return resp.StatusCode, errdefs.Wrap(kind, fmt.Errorf("HTTP %d: %s", resp.StatusCode, msg), "%s: %s %s", v, method, op)
	}
	if out != nil {
		var envelope struct {
			Data json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(data, &envelope); err != nil || len(envelope.Data) == 0 {
			return resp.StatusCode, fmt.Errorf("%s: %s %s: the answer holds no data", v, method, op)
		}
		if err := json.Unmarshal(envelope.Data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s: %s %s: %w", v, method, op, err)
		}
	}
	return resp.StatusCode, nil
}

func (v *vaultTransit) Wrap(ctx context.Context, owner string, passphrase []byte, secrets map[string]string) (string, error) {
	name := keyName(v.prefix, owner)
	if _, err := v.call(ctx, http.MethodPost, "keys/"+name, map[string]string{"type": "aes256-gcm96"}, nil, secrets); err != nil {
		return "", err
	}
	var out struct {
		Ciphertext string `json:"ciphertext"`
	}
	in := map[string]string{"plaintext": base64.StdEncoding.EncodeToString(passphrase)}
	defer clear(in)
	if _, err := v.call(ctx, http.MethodPost, "encrypt/"+name, in, &out, secrets); err != nil {
		return "", err
	}
	if !strings.HasPrefix(out.Ciphertext, "vault:") {
		return "", fmt.Errorf("%s: encrypt/%s answered no ciphertext", v, name)
	}
	return out.Ciphertext, nil
}

func (v *vaultTransit) Unwrap(ctx context.Context, owner, wrapped string, secrets map[string]string) ([]byte, error) {
	if !strings.HasPrefix(wrapped, "vault:") {
		return nil, errdefs.Precondition("%s: the wrapped key of %s was not made by Vault's transit engine", v, owner)
	}
	name := keyName(v.prefix, owner)
	var out struct {
		Plaintext string `json:"plaintext"`
	}
	if _, err := v.call(ctx, http.MethodPost, "decrypt/"+name, map[string]string{"ciphertext": wrapped}, &out, secrets); err != nil {
		return nil, err
	}
	plain, err := base64.StdEncoding.DecodeString(out.Plaintext)
	out.Plaintext = ""
	if err != nil {
		return nil, fmt.Errorf("%s: decrypt/%s answered a plaintext that is not base64", v, name)
	}
	return plain, nil
}

// Forget deletes owner's transit key; Vault deletes a key only once its
// configuration allows it. A key that is not there is success.
func (v *vaultTransit) Forget(ctx context.Context, owner string, secrets map[string]string) error {
	name := keyName(v.prefix, owner)
	_, err := v.call(ctx, http.MethodPost, "keys/"+name+"/config", map[string]bool{"deletion_allowed": true}, nil, secrets)
	if errdefs.KindOf(err) == errdefs.ErrNotFound || isMissingKey(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err = v.call(ctx, http.MethodDelete, "keys/"+name, nil, nil, secrets); err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
		return err
	}
	return nil
}

// isMissingKey recognises Vault's answer to a config update of a key that
// does not exist (HTTP 400 "no existing key named ... could be found").
func isMissingKey(err error) bool {
	return err != nil && strings.Contains(err.Error(), "could be found")
}
