package blockdev

import (
	"os"
	"path/filepath"
	"testing"
)

func TestInUse(t *testing.T) {
	if busy, err := InUse(filepath.Join(t.TempDir(), "gone")); busy || err != nil {
		t.Fatalf("a missing device: busy=%t, %v; want not in use", busy, err)
	}
	// Any other failure is an error, never "not in use".
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := InUse(filepath.Join(file, "below-a-file")); err == nil {
		t.Fatal("a path below a regular file: no error")
	}
}
