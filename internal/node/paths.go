package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// The node plugin runs as root on every node, so a wrong path in a request
// (a kubelet bug, a hand-made call while debugging, a misconfigured
// --kubelet-dir) must never become lost data. Every path a Node request
// names is confined to the plugin's allowed roots before anything looks at
// it, and the plugin creates and removes only what it could have made
// itself: an empty directory (a mount point) or an empty regular file (the
// bind target of a block volume).

// PathGuard confines request paths to a set of root directories.
type PathGuard struct {
	roots []string
}

// NewPathGuard returns a guard over roots: absolute directories (kubelet's
// directory, and whatever the operator allows besides).
func NewPathGuard(roots ...string) (*PathGuard, error) {
	if len(roots) == 0 {
		return nil, errors.New("no allowed path root: the node plugin needs kubelet's directory or an allowed root")
	}
	g := &PathGuard{}
	for _, r := range roots {
		if !filepath.IsAbs(r) {
			return nil, fmt.Errorf("allowed path root %q is not an absolute path", r)
		}
		if filepath.Clean(r) == "/" {
			return nil, errors.New("allowed path root \"/\" would confine nothing")
		}
		g.roots = append(g.roots, filepath.Clean(r))
	}
	return g, nil
}

// Roots returns the roots as configured.
func (g *PathGuard) Roots() []string { return append([]string(nil), g.roots...) }

// Confine checks path (absolute and clean, as the driver validated it) and
// returns it with the symlinks of its parent directories resolved: the
// path every later step uses, so a symlink cannot redirect it afterwards.
// The resolved path must lie strictly below a root (roots are resolved
// too, so a kubelet directory that is itself a symlink works); anything
// else is INVALID_ARGUMENT naming the path and the roots. A symlink in the
// path's own place is FAILED_PRECONDITION: it is never followed.
func (g *PathGuard) Confine(field, path string) (string, error) {
	parent, err := resolveParents(field, filepath.Dir(path))
	if err != nil {
		return "", err
	}
	resolved := filepath.Join(parent, filepath.Base(path))
	if !g.allows(resolved) {
		shown := path
		if resolved != path {
			shown = fmt.Sprintf("%s (%s once its symlinks are resolved)", path, resolved)
		}
		return "", errdefs.InvalidArgument("%s %s is not below an allowed root of this node plugin (%s); set --kubelet-dir to kubelet's directory or add --allowed-path-root",
			field, shown, strings.Join(g.roots, ", "))
	}
	if st, err := os.Lstat(resolved); err == nil && st.Mode()&os.ModeSymlink != 0 {
		target, _ := os.Readlink(resolved)
		return "", errdefs.Precondition("%s %s is a symlink (to %s); the node plugin never follows one", field, resolved, target)
	}
	return resolved, nil
}

// allows reports whether resolved lies strictly below one of the roots.
func (g *PathGuard) allows(resolved string) bool {
	for _, root := range g.roots {
		if r, err := filepath.EvalSymlinks(root); err == nil {
			root = r
		}
		if rel, err := filepath.Rel(root, resolved); err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../") {
			return true
		}
	}
	return false
}

// resolveParents resolves the symlinks in dir. Directories that do not
// exist yet cannot be symlinks and are kept as they are; a dangling
// symlink is refused, since creating below it would create wherever it
// points.
func resolveParents(field, dir string) (string, error) {
	var missing []string
	for p := dir; ; p = filepath.Dir(p) {
		r, err := filepath.EvalSymlinks(p)
		if err == nil {
			if st, err := os.Stat(r); err == nil && !st.IsDir() {
				return "", errdefs.Precondition("%s: %s, a parent of the path, is not a directory", field, p)
			}
			for i := len(missing) - 1; i >= 0; i-- {
				r = filepath.Join(r, missing[i])
			}
			return r, nil
		}
		switch {
		case errors.Is(err, unix.ENOTDIR):
			return "", errdefs.Precondition("%s: a parent of %s is not a directory", field, dir)
		case !os.IsNotExist(err):
			return "", errdefs.Wrap(errdefs.ErrPrecondition, err, "%s: cannot resolve %s", field, dir)
		}
		if _, lerr := os.Lstat(p); lerr == nil {
			return "", errdefs.Precondition("%s: %s is a symlink to a path that does not exist", field, p)
		}
		if p == "/" {
			return "", errdefs.Wrap(errdefs.ErrPrecondition, err, "%s: cannot resolve %s", field, dir)
		}
		missing = append(missing, filepath.Base(p))
	}
}

func fileMode(m uint32) os.FileMode {
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		return os.ModeDir
	case unix.S_IFLNK:
		return os.ModeSymlink
	case unix.S_IFBLK:
		return os.ModeDevice
	case unix.S_IFCHR:
		return os.ModeDevice | os.ModeCharDevice
	case unix.S_IFSOCK:
		return os.ModeSocket
	case unix.S_IFIFO:
		return os.ModeNamedPipe
	}
	return 0 // regular
}

// checkStagingPath refuses a staging path that holds anything but a
// directory (or a dead mount, which unstaging removes): a staging path is a
// directory kubelet makes, and nothing else there is the driver's.
func checkStagingPath(h Host, field, path string) error {
	e, err := h.Stat(path)
	if err != nil {
		return err
	}
	if e.Exists && !e.Dead && e.Type != os.ModeDir {
		return errdefs.Precondition("%s %s is %s, not a directory; the node plugin leaves it as it is", field, path, e)
	}
	return nil
}

// checkEmptyStagingPath refuses, for a block volume's stage (which mounts
// nothing there), a staging path that is anything but missing or an empty
// directory: kubelet makes it empty, so content there is not the volume's.
func checkEmptyStagingPath(h Host, field, path string) error {
	if err := checkStagingPath(h, field, path); err != nil {
		return err
	}
	if e, err := h.Stat(path); err != nil || !e.IsDir() {
		return err
	}
	empty, err := h.DirEmpty(path)
	if err != nil {
		return err
	}
	if !empty {
		return errdefs.Precondition("%s %s is a directory that is not empty; the node plugin stages only into the empty directory kubelet made", field, path)
	}
	return nil
}

// prepareMountPoint makes path ready to be mounted on: an empty directory,
// created if missing (with its parents). A directory with entries, or
// anything that is not a directory, is refused untouched: mounting over
// it would hide what it holds. The caller has checked that nothing is
// mounted at path already.
func prepareMountPoint(h Host, field, path string) error {
	for attempt := 0; ; attempt++ {
		e, err := h.Stat(path)
		if err != nil {
			return err
		}
		switch {
		case !e.Exists && attempt == 0:
			if err := h.MakeDir(path); err != nil {
				return errdefs.Wrap(errdefs.ErrPrecondition, err, "%s: create %s", field, path)
			}
			continue // whatever raced us to it is checked too
		case !e.IsDir():
			return errdefs.Precondition("%s %s is %s, not a directory to mount on; the node plugin leaves it as it is", field, path, e)
		}
		empty, err := h.DirEmpty(path)
		if err != nil {
			return err
		}
		if !empty {
			return errdefs.Precondition("%s %s is a directory that is not empty and not a mount; mounting over it would hide what it holds", field, path)
		}
		return nil
	}
}

// prepareDeviceTarget makes path ready for a block volume's device to be
// bound onto it: an empty regular file, created if missing. A file with
// data, or anything that is not a regular file, is refused untouched.
func prepareDeviceTarget(h Host, field, path string) error {
	for attempt := 0; ; attempt++ {
		e, err := h.Stat(path)
		if err != nil {
			return err
		}
		switch {
		case !e.Exists && attempt == 0:
			if err := h.MakeFile(path); err != nil && !os.IsExist(err) {
				return errdefs.Wrap(errdefs.ErrPrecondition, err, "%s: create %s", field, path)
			}
			continue
		case e.IsEmptyFile():
			return nil
		}
		return errdefs.Precondition("%s %s is %s, not an empty file to bind a block device onto; the node plugin leaves it as it is", field, path, e)
	}
}

// removeMountPoint removes what is left at path once nothing is mounted
// there, if it is what the driver could have made: an empty directory or
// an empty regular file. Anything else (a file with data, a device node, a
// symlink, a socket, a directory with entries) is left as it is and named
// in a FAILED_PRECONDITION error. A missing path is fine.
func removeMountPoint(h Host, field, path string) error {
	e, err := h.Stat(path)
	if err != nil {
		return err
	}
	switch {
	case !e.Exists:
		return nil
	case e.IsDir(), e.IsEmptyFile():
		err := h.Remove(path)
		switch {
		case errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST):
			return errdefs.Precondition("%s %s is a directory that is not empty; the node plugin removes only the empty directory it made", field, path)
		case err != nil && !errors.Is(err, unix.ENOENT):
			return err
		}
		return nil
	}
	return errdefs.Precondition("%s %s is %s; the node plugin removes only the empty directory or empty file it made, and leaves this as it is", field, path, e)
}
