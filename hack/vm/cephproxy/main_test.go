//go:build ceph

package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The Ceph tier (-tags ceph, in a Ceph root, as the proxy runs in vmtest):
// the tests run the root's real rbd.

// The host runs the command with the guest's files and answers with its
// exact output and exit status; it runs nothing but rbd and ceph.
func TestRunOnTheHost(t *testing.T) {
	requireRBD(t)
	tests := []struct {
		name       string
		req        request
		wantExit   int
		wantStdout string
		wantStderr string
		wantError  string
	}{
		{name: "stdout and status", req: request{Tool: "rbd", Args: []string{"--version"}}, wantStdout: "ceph version "},
		// A readable conf keeps rbd's config warnings, which another thread
		// writes, from landing in the middle of its usage error.
		{name: "failure status and stderr", req: request{Tool: "rbd", Args: []string{"bogus", "-c", "/guest/ceph.conf"}, Files: map[int][]byte{2: []byte("[global]\n")}},
			wantExit: 1, wantStderr: "unknown option 'bogus'"},
		// The guest's conf travels as content: a conf the host parses and
		// rejects shows it reached rbd (the guest's path does not exist here).
		{name: "file argument", req: request{Tool: "rbd", Args: []string{"ls", "-c", "/guest/only/ceph.conf"}, Files: map[int][]byte{2: []byte("[global\n")}},
			wantExit: 1, wantStderr: "parse"},
		{name: "other tools refused", req: request{Tool: "sh", Args: []string{"-c", "true"}}, wantError: `"sh" is not rbd or ceph`},
		{name: "file index out of range", req: request{Tool: "rbd", Args: []string{"ls"}, Files: map[int][]byte{5: nil}}, wantError: "out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := run(tt.req)
			if got.Error != "" || tt.wantError != "" {
				if tt.wantError == "" || !strings.Contains(got.Error, tt.wantError) {
					t.Fatalf("error %q, want %q", got.Error, tt.wantError)
				}
				return
			}
			if got.Exit != tt.wantExit || !strings.Contains(string(got.Stdout), tt.wantStdout) || !strings.Contains(strings.ToLower(string(got.Stderr)), strings.ToLower(tt.wantStderr)) {
				t.Errorf("exit %d, stdout %.200q, stderr %.300q; want exit %d, stdout with %q, stderr with %q",
					got.Exit, got.Stdout, got.Stderr, tt.wantExit, tt.wantStdout, tt.wantStderr)
			}
		})
	}
}

// The stand-in reads its file arguments and sends them; a missing one
// fails here, before anything reaches the host.
func TestStandInSendsFilesAndStatus(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() { _ = serveOn(l) }()
	t.Setenv(EnvProxy, l.Addr().String())
	requireRBD(t)
	conf := filepath.Join(t.TempDir(), "ceph.conf")
	if err := os.WriteFile(conf, []byte("[global]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := standIn("rbd", []string{"bogus", "-c", conf}); code != 1 {
		t.Errorf("rbd bogus through the proxy exited %d, want rbd's 1", code)
	}
	if code := standIn("rbd", []string{"ls", "-c", filepath.Join(t.TempDir(), "missing.conf")}); code != 1 {
		t.Errorf("a missing -c file exited %d, want 1", code)
	}
}

// requireRBD fails t unless the Ceph root's rbd is on PATH.
func requireRBD(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("rbd"); err != nil {
		t.Fatalf("no rbd on PATH: the Ceph tier runs in a Ceph root (go test -exec hack/ceph/run): %v", err)
	}
}
