// Package kmstest starts a real Vault-compatible server for the KMS tests.
package kmstest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// EnvVault names the Vault (or OpenBao) server binary the real-server test
// starts; without it the test looks for vault, then bao, on PATH. Neither
// builds from the Go module proxy here (docs/testing.md says why), so the
// test skips on a machine that has neither.
const EnvVault = "SPINDLE_VAULT"

func vaultBinary(t testing.TB) string {
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

// Vault is a Vault (or OpenBao) server in dev mode on 127.0.0.1, with the
// transit engine enabled at transit/, stopped when the test ends.
type Vault struct {
	Addr, Token string
	cmd         *exec.Cmd
	log         *bytes.Buffer
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// StartVault starts one, or skips t naming what is missing.
func StartVault(t testing.TB) *Vault {
	t.Helper()
	bin := vaultBinary(t)
	tokenBytes := make([]byte, 16)
	_, _ = rand.Read(tokenBytes)
	// A token ID with a "." is refused by OpenBao (and "s." is a service
	// token's prefix); plain hex is taken by both.
	v := &Vault{Token: "root" + hex.EncodeToString(tokenBytes), log: &bytes.Buffer{}}
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	v.Addr = "http://" + listen
	v.cmd = exec.Command(bin, "server", "-dev", "-dev-no-store-token", "-dev-root-token-id="+v.Token, "-dev-listen-address="+listen)
	// The token goes on the command line here, in a test's throwaway dev
	// server: the driver itself never passes one there.
	v.cmd.Env = append(os.Environ(), "VAULT_DISABLE_MLOCK=true", "HOME="+t.TempDir())
	v.cmd.Stdout, v.cmd.Stderr = v.log, v.log
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := v.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Cleanup(v.Stop)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(v.Addr + "/v1/sys/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("Vault did not become ready at %s: %v\n%s", v.Addr, err, v.log)
		}
		time.Sleep(200 * time.Millisecond)
	}
	req, _ := http.NewRequest(http.MethodPost, v.Addr+"/v1/sys/mounts/transit", strings.NewReader(`{"type":"transit"}`))
	req.Header.Set("X-Vault-Token", v.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("enable transit: %v %v", resp, err)
	}
	resp.Body.Close()
	return v
}

// Stop stops the server (a test of an outage calls it early).
func (v *Vault) Stop() {
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

// TransitKeyExists asks the server whether the transit key name is there.
func (v *Vault) TransitKeyExists(t testing.TB, name string) bool {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, v.Addr+"/v1/transit/keys/"+name, nil)
	req.Header.Set("X-Vault-Token", v.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Log is what the server printed.
func (v *Vault) Log() string { return v.log.String() }

// TransitKeys lists the transit keys on the server.
func (v *Vault) TransitKeys(t testing.TB) []string {
	t.Helper()
	req, _ := http.NewRequest("LIST", v.Addr+"/v1/transit/keys", nil)
	req.Header.Set("X-Vault-Token", v.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil // none
	}
	var out struct {
		Data struct {
			Keys []string `json:"keys"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Data.Keys
}
