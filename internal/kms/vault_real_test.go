package kms

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// EnvVault names the Vault (or OpenBao) server binary the real-server test
// starts; without it the test looks for vault, then bao, on PATH. Neither
// builds from the Go module proxy here (docs/testing.md says why), so the
// test skips on a machine that has neither.
const EnvVault = "SPINDLE_VAULT"

func vaultBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(EnvVault); p != "" {
		return p
	}
	for _, name := range []string{"vault", "bao"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skipf("no Vault or OpenBao server binary: set %s to one, or put vault or bao on PATH", EnvVault)
	return ""
}

// devVault is a Vault server in dev mode on 127.0.0.1, with the transit
// engine enabled at transit/.
type devVault struct {
	addr, token string
	cmd         *exec.Cmd
	log         *bytes.Buffer
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func startDevVault(t *testing.T) *devVault {
	t.Helper()
	bin := vaultBinary(t)
	tokenBytes := make([]byte, 16)
	_, _ = rand.Read(tokenBytes)
	v := &devVault{token: "s." + hex.EncodeToString(tokenBytes), log: &bytes.Buffer{}}
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	v.addr = "http://" + listen
	v.cmd = exec.Command(bin, "server", "-dev", "-dev-no-store-token", "-dev-root-token-id="+v.token, "-dev-listen-address="+listen)
	// The token goes on the command line here, in a test's throwaway dev
	// server: the driver itself never passes one there.
	v.cmd.Env = append(os.Environ(), "VAULT_DISABLE_MLOCK=true", "HOME="+t.TempDir())
	v.cmd.Stdout, v.cmd.Stderr = v.log, v.log
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := v.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Cleanup(v.stop)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(v.addr + "/v1/sys/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("Vault did not become ready at %s: %v\n%s", v.addr, err, v.log)
		}
		time.Sleep(200 * time.Millisecond)
	}
	req, _ := http.NewRequest(http.MethodPost, v.addr+"/v1/sys/mounts/transit", strings.NewReader(`{"type":"transit"}`))
	req.Header.Set("X-Vault-Token", v.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("enable transit: %v %v", resp, err)
	}
	resp.Body.Close()
	return v
}

func (v *devVault) stop() {
	if v.cmd.Process == nil || v.cmd.ProcessState != nil {
		return
	}
	_ = v.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = v.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = v.cmd.Process.Kill()
		<-done
	}
}

// transitKeyExists asks Vault whether owner's transit key is there.
func (v *devVault) transitKeyExists(t *testing.T, name string) bool {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, v.addr+"/v1/transit/keys/"+name, nil)
	req.Header.Set("X-Vault-Token", v.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Vault's transit engine, for real: a passphrase wrapped and unwrapped
// through a per-volume transit key, the key deleted with the volume, and
// a stopped Vault answered UNAVAILABLE naming it.
func TestVaultTransitRealServer(t *testing.T) {
	v := startDevVault(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(v.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reg, err := NewRegistry(map[string]Settings{"vault-test": {Type: TypeVaultTransit, VaultAddress: v.addr, VaultTokenFile: tokenFile, VaultTimeout: "5s"}})
	if err != nil {
		t.Fatal(err)
	}
	k, _ := reg.Get("vault-test")
	ctx := context.Background()
	const owner, other = "loop/default/pvc-vault", "loop/default/pvc-other"
	pass, _ := NewPassphrase()
	wrapped, err := k.Wrap(ctx, owner, pass, nil)
	if err != nil {
		t.Fatalf("Wrap: %v\n%s", err, v.log)
	}
	if !strings.HasPrefix(wrapped, "vault:v1:") || strings.Contains(wrapped, string(pass)) {
		t.Fatalf("wrapped %q", wrapped)
	}
	if !v.transitKeyExists(t, keyName("spindle-", owner)) {
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
	if err := os.WriteFile(tokenFile, []byte(v.token), 0o600); err != nil {
		t.Fatal(err)
	}
	// Deleting the volume deletes its key: the wrapped copy is useless.
	for i := 0; i < 2; i++ { // the second is a retried DeleteVolume
		if err := k.Forget(ctx, owner, nil); err != nil {
			t.Fatalf("Forget #%d: %v", i+1, err)
		}
	}
	if v.transitKeyExists(t, keyName("spindle-", owner)) {
		t.Fatal("the transit key is still there after Forget")
	}
	if _, err := k.Unwrap(ctx, owner, wrapped, nil); err == nil {
		t.Fatal("a forgotten volume's passphrase still unwraps")
	}
	// Vault stopped: UNAVAILABLE, naming it.
	v.stop()
	_, err = k.Unwrap(ctx, other, wrapped, nil)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "kms vault-test (Vault transit at "+v.addr) {
		t.Fatalf("Unwrap with Vault stopped = %v", err)
	}
	t.Logf("with Vault stopped: %v", err)
	if strings.Contains(err.Error(), v.token) || strings.Contains(err.Error(), string(pass)) {
		t.Fatalf("the error holds a secret: %v", err)
	}
}
