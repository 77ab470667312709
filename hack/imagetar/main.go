// Command imagetar assembles a container image as a docker-archive tarball
// (the `docker save` format, which `ctr images import` and `kind load
// image-archive` read) from files on this machine, without a container
// engine or a registry.
//
//	go run ./hack/imagetar -tag local.test/spindle:dev -o spindle.tar \
//	    -entrypoint /usr/local/bin/spindle \
//	    -file bin/spindle:/usr/local/bin/spindle -program mkfs.ext4 -program blkid
//
// -file copies one file; -tree copies a directory with its files,
// directories and symlinks (a package's data, e.g. PostgreSQL's share
// directory); -program copies a program found on PATH together with the
// shared libraries ldd reports for it (and the dynamic loader), so the
// image's tools run exactly as they do on the host. -user sets the user the
// image's processes run as. With -merged-usr the
// image has Debian's merged /usr like the host: /bin, /sbin, /lib and /lib64
// are symlinks into /usr, and files are stored under /usr, so scripts'
// "#!/bin/sh" and the loader path /lib64/ld-linux-x86-64.so.2 resolve. The layer is written
// deterministically (sorted, zero times, root-owned), so the same inputs make
// the same image ID.
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "imagetar:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("imagetar", flag.ContinueOnError)
	tag := fs.String("tag", "", "image reference, e.g. local.test/spindle:dev (required)")
	out := fs.String("o", "", "output tarball (required)")
	var entrypoint, cmd, files, trees, excludes, programs, envs, dirs, symlinks listFlag
	fs.Var(&entrypoint, "entrypoint", "entrypoint argument (repeat for each)")
	fs.Var(&cmd, "cmd", "default command argument (repeat for each)")
	fs.Var(&files, "file", "SRC[:DST] file to copy into the image (DST defaults to SRC)")
	fs.Var(&trees, "tree", "SRC[:DST] directory to copy with everything in it (DST defaults to SRC)")
	fs.Var(&excludes, "exclude", "name pattern (path.Match) of what -tree leaves out, e.g. __pycache__")
	fs.Var(&programs, "program", "program on PATH to copy with its shared libraries")
	var binaries listFlag
	fs.Var(&binaries, "binary", "SRC:DST program file to copy with its shared libraries (a program not on PATH)")
	fs.Var(&envs, "env", "KEY=VALUE in the image config")
	fs.Var(&dirs, "dir", "empty directory to create in the image")
	fs.Var(&symlinks, "symlink", "LINK:TARGET symlink to create in the image")
	user := fs.String("user", "", "user (UID[:GID]) the image's processes run as; default root")
	mergedUsr := fs.Bool("merged-usr", false, "make /bin, /sbin, /lib and /lib64 symlinks into /usr and store files there")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *tag == "" || *out == "" {
		return errors.New("-tag and -o are required")
	}
	layer := newLayer()
	if *mergedUsr {
		for _, d := range mergedDirs {
			layer.dir("/usr/" + d)
			layer.entries["/"+d] = entry{kind: tar.TypeSymlink, target: "usr/" + d}
		}
		layer.mergedUsr = true
	}
	for _, d := range append([]string{"/tmp", "/etc", "/dev", "/proc", "/sys", "/run"}, dirs...) {
		layer.dir(d)
	}
	// Programs that look for /etc/mtab (mount, blkid) find the kernel's.
	layer.symlink("/etc/mtab", "../proc/self/mounts")
	for _, f := range files {
		src, dst, _ := strings.Cut(f, ":")
		if dst == "" {
			dst = src
		}
		if err := layer.file(src, dst); err != nil {
			return err
		}
	}
	for _, tr := range trees {
		src, dst, _ := strings.Cut(tr, ":")
		if dst == "" {
			dst = src
		}
		if err := layer.tree(src, dst, excludes); err != nil {
			return err
		}
	}
	for _, p := range programs {
		if err := layer.program(p); err != nil {
			return err
		}
	}
	for _, b := range binaries {
		src, dst, ok := strings.Cut(b, ":")
		if !ok || src == "" || dst == "" {
			return fmt.Errorf("-binary %q: want SRC:DST", b)
		}
		if err := layer.file(src, dst); err != nil {
			return err
		}
		if err := layer.libraries(src); err != nil {
			return err
		}
	}
	for _, s := range symlinks {
		link, target, ok := strings.Cut(s, ":")
		if !ok || link == "" || target == "" {
			return fmt.Errorf("-symlink %q: want LINK:TARGET", s)
		}
		layer.symlink(layer.canon(link), target)
	}
	return write(*out, *tag, layer, imageConfig{Entrypoint: entrypoint, Cmd: cmd, Env: envs, User: *user})
}

// layer is the image's single filesystem layer, keyed by path in the image.
type layer struct {
	entries   map[string]entry
	mergedUsr bool
}

// mergedDirs are the top-level directories that merged /usr turns into
// symlinks.
var mergedDirs = []string{"bin", "sbin", "lib", "lib64"}

// canon is p as stored in the layer: under /usr for a merged-/usr image.
func (l *layer) canon(p string) string {
	p = path.Clean("/" + p)
	if l.mergedUsr {
		for _, d := range mergedDirs {
			if p == "/"+d || strings.HasPrefix(p, "/"+d+"/") {
				return "/usr" + p
			}
		}
	}
	return p
}

type entry struct {
	kind   byte // tar.TypeReg, TypeDir, TypeSymlink
	src    string
	target string
	mode   int64
}

func newLayer() *layer { return &layer{entries: map[string]entry{}} }

func (l *layer) dir(p string) {
	p = l.canon(p)
	for d := p; d != "/"; d = path.Dir(d) {
		if _, ok := l.entries[d]; !ok {
			mode := int64(0o755)
			if d == "/tmp" {
				mode = 0o1777
			}
			l.entries[d] = entry{kind: tar.TypeDir, mode: mode}
		}
	}
}

func (l *layer) symlink(p, target string) {
	l.dir(path.Dir(p))
	l.entries[path.Clean(p)] = entry{kind: tar.TypeSymlink, target: target}
}

// file copies src to dst, following symlinks (the image gets the content).
func (l *layer) file(src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", src)
	}
	dst = l.canon(dst)
	l.dir(path.Dir(dst))
	l.entries[dst] = entry{kind: tar.TypeReg, src: src, mode: int64(st.Mode().Perm())}
	return nil
}

// tree copies the directory src to dst: its regular files with their
// permissions, its directories and its symlinks as symlinks (their targets
// unchanged, so relative links inside the tree keep working), leaving out
// what has a name that matches one of excludes.
func (l *layer) tree(src, dst string, excludes []string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("-tree %s is not a directory", src)
	}
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		for _, pattern := range excludes {
			if matched, err := path.Match(pattern, d.Name()); err != nil {
				return fmt.Errorf("-exclude %q: %w", pattern, err)
			} else if matched && p != src {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := path.Join(dst, filepath.ToSlash(rel))
		switch {
		case d.IsDir():
			l.dir(to)
		case d.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			l.symlink(l.canon(to), target)
		case d.Type().IsRegular():
			return l.file(p, to)
		default:
			return fmt.Errorf("-tree %s: %s is neither a file, a directory nor a symlink", src, p)
		}
		return nil
	})
}

var lddLine = regexp.MustCompile(`(?:=>\s*)?(/\S+)\s+\(0x`)

// program copies a program from PATH and every library ldd lists for it,
// keeping the paths the loader expects.
func (l *layer) program(name string) error {
	p, err := exec.LookPath(name)
	if err != nil {
		if p, err = exec.LookPath(filepath.Join("/usr/sbin", name)); err != nil {
			if p, err = exec.LookPath(filepath.Join("/sbin", name)); err != nil {
				return fmt.Errorf("program %s: not found on PATH, /usr/sbin or /sbin", name)
			}
		}
	}
	if err := l.file(p, p); err != nil {
		return err
	}
	// Debian's merged /usr: /sbin/x is /usr/sbin/x; give both names.
	if real, err := filepath.EvalSymlinks(p); err == nil && real != p {
		if err := l.file(real, real); err != nil {
			return err
		}
	}
	return l.libraries(p)
}

// libraries copies the shared libraries ldd reports for the program at p
// (and the dynamic loader).
func (l *layer) libraries(p string) error {
	c := exec.Command("ldd", p)
	c.Env = append(os.Environ(), "LC_ALL=C")
	outBytes, err := c.Output()
	if err != nil {
		// A static program has no libraries; ldd says so and exits 1.
		return nil
	}
	for _, line := range strings.Split(string(outBytes), "\n") {
		m := lddLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if err := l.file(m[1], m[1]); err != nil {
			return fmt.Errorf("library of %s: %w", p, err)
		}
	}
	return nil
}

func (l *layer) tar(w io.Writer) error {
	tw := tar.NewWriter(w)
	names := make([]string, 0, len(l.entries))
	for n := range l.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		e := l.entries[n]
		h := &tar.Header{Name: strings.TrimPrefix(n, "/"), Mode: e.mode, Typeflag: e.kind, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		switch e.kind {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeSymlink:
			h.Linkname, h.Mode = e.target, 0o777
		case tar.TypeReg:
			data, err := os.ReadFile(e.src)
			if err != nil {
				return err
			}
			h.Size = int64(len(data))
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if _, err := tw.Write(data); err != nil {
				return err
			}
			continue
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
	}
	return tw.Close()
}

// imageConfig is what the image's config says about running it.
type imageConfig struct {
	Entrypoint, Cmd, Env []string
	User                 string
}

// write puts layer.tar, the image config and manifest.json into out.
func write(out, tag string, l *layer, ic imageConfig) error {
	var layerTar bytes.Buffer
	if err := l.tar(&layerTar); err != nil {
		return err
	}
	diffID := sha256.Sum256(layerTar.Bytes())
	config := map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config": map[string]any{"Entrypoint": ic.Entrypoint, "Cmd": ic.Cmd, "User": ic.User,
			"Env": append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, ic.Env...)},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(diffID[:])}},
		"created": "1970-01-01T00:00:00Z",
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return err
	}
	configSum := sha256.Sum256(configJSON)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{"Config": configName, "RepoTags": []string{tag}, "Layers": []string{"layer.tar"}}})
	if err != nil {
		return err
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	for _, member := range []struct {
		name string
		data []byte
	}{{"layer.tar", layerTar.Bytes()}, {configName, configJSON}, {"manifest.json", manifest}} {
		if err := tw.WriteHeader(&tar.Header{Name: member.name, Mode: 0o644, Size: int64(len(member.data)), ModTime: time.Unix(0, 0)}); err != nil {
			f.Close()
			return err
		}
		if _, err := tw.Write(member.data); err != nil {
			f.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}
