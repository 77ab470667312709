package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readImage returns the layer's entries (name → kind and link target or
// content) and the image config of a tarball run wrote.
func readImage(t *testing.T, file string) (map[string]string, map[string]any) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	members := map[string][]byte{}
	eachMember(t, f, func(h *tar.Header, data []byte) { members[h.Name] = data })
	var manifest []struct{ Config string }
	if err := json.Unmarshal(members["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("manifest.json: %v %s", err, members["manifest.json"])
	}
	var config map[string]any
	if err := json.Unmarshal(members[manifest[0].Config], &config); err != nil {
		t.Fatal(err)
	}
	entries := map[string]string{}
	eachMember(t, bytes.NewReader(members["layer.tar"]), func(h *tar.Header, data []byte) {
		switch h.Typeflag {
		case tar.TypeDir:
			entries[h.Name] = "dir"
		case tar.TypeSymlink:
			entries[h.Name] = "-> " + h.Linkname
		default:
			entries[h.Name] = "file " + string(data)
		}
	})
	return entries, config["config"].(map[string]any)
}

// eachMember calls fn with each member of the tar stream r and its content.
func eachMember(t *testing.T, r io.Reader, fn func(*tar.Header, []byte)) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		fn(h, data)
	}
}

// -tree copies files, directories and symlinks, leaving out what -exclude
// names at any depth; -user lands in the config.
func TestTreeExcludeAndUser(t *testing.T) {
	src := t.TempDir()
	for name, content := range map[string]string{
		"share/a.sql":                 "a",
		"share/sub/b.conf":            "b",
		"share/__pycache__/a.pyc":     "cache",
		"share/sub/test/t.py":         "test",
		"share/sub/__pycache__/b.pyc": "cache",
	} {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("sub/b.conf", filepath.Join(src, "share/link")); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "img.tar")
	err := run([]string{"-tag", "local.test/x:1", "-o", out, "-user", "999:999",
		"-tree", filepath.Join(src, "share") + ":/usr/share/x", "-exclude", "__pycache__", "-exclude", "test"})
	if err != nil {
		t.Fatal(err)
	}
	entries, config := readImage(t, out)
	want := map[string]string{
		"usr/share/x/":           "dir",
		"usr/share/x/a.sql":      "file a",
		"usr/share/x/sub/":       "dir",
		"usr/share/x/sub/b.conf": "file b",
		"usr/share/x/link":       "-> sub/b.conf",
	}
	for name, w := range want {
		if got := entries[name]; got != w {
			t.Errorf("%s: %q, want %q", name, got, w)
		}
	}
	for name := range entries {
		if strings.Contains(name, "__pycache__") || strings.Contains(name, "/test") {
			t.Errorf("excluded %s is in the layer", name)
		}
	}
	if config["User"] != "999:999" {
		t.Errorf("config User %v, want 999:999", config["User"])
	}
}

func TestTreeRefusesAFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := run([]string{"-tag", "local.test/x:1", "-o", filepath.Join(t.TempDir(), "img.tar"), "-tree", f})
	if err == nil || !strings.Contains(err.Error(), "is not a directory") {
		t.Fatalf("-tree of a file: %v, want an error saying it is not a directory", err)
	}
}
