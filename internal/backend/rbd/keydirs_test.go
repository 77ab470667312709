package rbd

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestRemoveStaleKeyDirs(t *testing.T) {
	now := time.Now()
	old, fresh := now.Add(-staleKeyDirAge-time.Minute), now.Add(-time.Minute)
	tests := []struct {
		name    string
		dir     bool
		modTime time.Time
		removed bool
	}{
		{"spindle-rbd-key-111", true, old, true},
		{"spindle-rbd-node-222", true, old, true},
		{"spindle-rbd-key-333", true, fresh, false}, // a call that may still run
		{"spindle-rbd-key-444", false, old, false},  // not a directory the driver made
		{"spindle-ceph-555", true, old, false},      // someone else's
	}
	root := t.TempDir()
	for _, tt := range tests {
		p := filepath.Join(root, tt.name)
		if tt.dir {
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(p, "key"), []byte("AQBsecret=="), 0o600); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, tt.modTime, tt.modTime); err != nil {
			t.Fatal(err)
		}
	}
	removed := removeStaleKeyDirs(root, now)
	for _, tt := range tests {
		p := filepath.Join(root, tt.name)
		_, err := os.Lstat(p)
		if gone := os.IsNotExist(err); gone != tt.removed {
			t.Errorf("%s: removed %v, want %v", tt.name, gone, tt.removed)
		}
		if slices.Contains(removed, p) != tt.removed {
			t.Errorf("%s: reported removed %v, want %v (reported %v)", tt.name, !tt.removed, tt.removed, removed)
		}
	}
}
