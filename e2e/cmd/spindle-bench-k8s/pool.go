package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// pool is the loop backend's pool directory as this machine sees it: the
// local cluster's node and controller share it.
type pool struct {
	dir string // resolved: the kernel names loop backing files by resolved path
}

// openPool returns nil, saying so, when the pool is not to be checked or
// is not on this machine.
func openPool(dir string) (*pool, error) {
	if dir == "none" {
		return nil, nil
	}
	resolved, err := filepath.EvalSymlinks(dir)
	if os.IsNotExist(err) {
		fmt.Fprintf(os.Stderr, "spindle-bench-k8s: no pool directory %s: the pool is not checked for leftovers (-pool-dir)\n", dir)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pool directory %s: %w", dir, err)
	}
	return &pool{dir: resolved}, nil
}

// imagePath is the image file behind a loop volume handle
// ("loop/<instance>/<image>"); "" for a handle of another backend.
func (p *pool) imagePath(handle string) string {
	parts := strings.Split(handle, "/")
	if len(parts) != 3 || parts[0] != "loop" {
		return ""
	}
	return filepath.Join(p.dir, parts[2]+".img")
}

// leftovers lists what of the volumes is still on this machine: their
// image files and the loop devices bound to them (a device on an unlinked
// image too, which sysfs marks " (deleted)").
func (p *pool) leftovers(handles []string) ([]string, error) {
	images := map[string]bool{}
	var out []string
	for _, h := range handles {
		path := p.imagePath(h)
		if path == "" {
			continue
		}
		images[path] = true
		if _, err := os.Lstat(path); err == nil {
			out = append(out, path)
		} else if !os.IsNotExist(err) {
			return nil, err
		}
	}
	backing, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, err
	}
	for _, f := range backing {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // unbound since the glob
		}
		file := strings.TrimSuffix(strings.TrimSpace(string(data)), " (deleted)")
		if images[file] {
			out = append(out, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(f)))+" on "+file)
		}
	}
	return out, nil
}
