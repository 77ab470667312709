package rbd

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/kmod"
)

// kernelMapper maps with "rbd device map": through the kernel's rbd driver
// (krbd) or, with nbd set, through rbd-nbd and the kernel's nbd driver.
type kernelMapper struct {
	c        *cluster
	nbd      bool
	sysRoot  string // "/sys"
	procRoot string // "/proc"
}

// module is the kernel module the mapper needs.
func (k *kernelMapper) module() string {
	if k.nbd {
		return "nbd"
	}
	return "rbd"
}

func (k *kernelMapper) typeArgs() []string {
	if k.nbd {
		return []string{"-t", "nbd"}
	}
	return nil
}

// Map runs "rbd device map" for krbd and "rbd-nbd map" for rbd-nbd. A
// node without the kernel module fails with texts like krbd's "rbd: failed
// to load rbd kernel module (127)" / "rbd: map failed: (2) No such file or
// directory", or rbd-nbd's "rbd-nbd: failed to find unused device": a
// precondition naming the module.
func (k *kernelMapper) Map(ctx context.Context, r ref, readOnly bool, options string) (string, error) {
	var out []byte
	var err error
	if k.nbd {
		out, err = k.nbdMap(ctx, r, readOnly, options)
	} else {
		if err := k.kernelTakesKey(ctx, r); err != nil {
			return "", err
		}
		args := []string{"device", "map"}
		if readOnly {
			args = append(args, "--read-only")
		}
		if options != "" {
			args = append(args, "-o", options)
		}
		out, err = k.c.program(ctx, k.c.run, r.cluster, "rbd", append(args, r.spec())...)
	}
	if err != nil {
		stderr := command.Stderr(err)
		if strings.Contains(stderr, "kernel module") || strings.Contains(stderr, "modprobe") || strings.Contains(stderr, "failed to find unused device") {
			return "", errdefs.Wrap(errdefs.ErrPrecondition, err, "this node cannot map RBD images with %s: the %q kernel module is not available; use another mounter (rbd-fuse needs none)", k.name(), k.module())
		}
		return "", err
	}
	dev := strings.TrimSpace(string(out))
	if !strings.HasPrefix(dev, "/dev/") {
		return "", fmt.Errorf("%s map printed %q, not a device", k.name(), dev)
	}
	return dev, nil
}

// kernelCipherSince is the first Linux whose Ceph client takes keys of
// cipher aes256k, Tentacle's default (libceph "add support for
// CEPH_CRYPTO_AES256KRB5", 7.0). Older kernels fail the map with an error
// that names nothing (ENOTSUPP, 524, from the key's decoding).
var kernelCipherSince = [2]int{7, 0}

// kernelTakesKey refuses, before krbd tries, a map whose cephx key is of a
// cipher the node's kernel cannot use, naming the cipher, the kernel and
// the ways out. A kernel release or key it cannot read is left to the map
// to report.
func (k *kernelMapper) kernelTakesKey(ctx context.Context, r ref) error {
	who, err := k.c.identityFor(ctx, r.cluster)
	if err != nil || who.fromConfig {
		return nil
	}
	key, err := k.c.keyValue(who)
	if err != nil {
		return nil
	}
	if cipher, err := ceph.KeyCipher(key); err != nil || cipher != ceph.CipherAES256K {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(k.procRoot, "sys", "kernel", "osrelease"))
	if err != nil {
		return nil
	}
	release := strings.TrimSpace(string(b))
	if major, minor, ok := kernelVersion(release); !ok || major > kernelCipherSince[0] || major == kernelCipherSince[0] && minor >= kernelCipherSince[1] {
		return nil
	}
	return errdefs.Precondition("krbd cannot map image %s on this node: the key of cephx user %s is of cipher %s (the default of Ceph 20 Tentacle), which the kernel's Ceph client takes from Linux %d.%d on, and this node runs Linux %s; use the rbd-nbd or rbd-fuse mounter for this StorageClass, or give the user a key of cipher %s and allow that cipher on the cluster (docs/backends.md, \"krbd with Tentacle's default keys\")",
		r.spec(), who.user, ceph.CipherAES256K, kernelCipherSince[0], kernelCipherSince[1], release, ceph.CipherAES)
}

// kernelVersion reads the major and minor numbers of a kernel release
// ("6.1.0-28-amd64").
func kernelVersion(release string) (major, minor int, ok bool) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	digits := func(s string) string { return s[:len(s)-len(strings.TrimLeft(s, "0123456789"))] }
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(digits(parts[1])) // "0-rc1" in "7.0-rc1"
	return major, minor, err1 == nil && err2 == nil
}

// nbdMap runs rbd-nbd itself, as "rbd device map -t nbd" would (its -o
// options become --options), in the attach daemon when the node plugin
// has one: the rbd-nbd process serves the device for as long as it is
// mapped and must outlive the node plugin. It reads its key before "map"
// returns.
func (k *kernelMapper) nbdMap(ctx context.Context, r ref, readOnly bool, options string) ([]byte, error) {
	args := []string{"map", r.spec()}
	if readOnly {
		args = append(args, "--read-only")
	}
	if options != "" {
		for _, o := range strings.Split(options, ",") {
			args = append(args, "--"+o)
		}
	}
	return k.c.program(ctx, k.c.run.Daemons(), r.cluster, "rbd-nbd", args...)
}

func (k *kernelMapper) name() string {
	if k.nbd {
		return MounterNBD
	}
	return MounterKRBD
}

// Unmap runs "rbd device unmap"; no credentials needed. A device that is
// no longer mapped ("not a mapped image or snapshot", "is not a block
// device") is done.
func (k *kernelMapper) Unmap(ctx context.Context, _ ref, dev, options string) error {
	args := append([]string{"device", "unmap"}, k.typeArgs()...)
	if options != "" {
		args = append(args, "-o", options)
	}
	args = append(args, dev)
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	_, err := k.c.run.Run(ctx, "rbd", args...)
	if err != nil {
		stderr := command.Stderr(err)
		if strings.Contains(stderr, "not a mapped image") || strings.Contains(stderr, "is not a block device") || strings.Contains(stderr, "No such file or directory") {
			return nil
		}
		if strings.Contains(stderr, "Device or resource busy") {
			return errdefs.Wrap(errdefs.ErrPrecondition, err, "%s is still in use", dev)
		}
		return err
	}
	return nil
}

// Mapped lists the image's devices: from /sys/bus/rbd for krbd, from
// "rbd device list -t nbd" for rbd-nbd.
func (k *kernelMapper) Mapped(ctx context.Context, r ref) ([]mapped, error) {
	all, err := k.all(ctx)
	if err != nil {
		return nil, err
	}
	var out []mapped
	for _, m := range all {
		if m.of(r) {
			out = append(out, m)
		}
	}
	return out, nil
}

// Makes: krbd's devices are /dev/rbdN, rbd-nbd's /dev/nbdN.
func (k *kernelMapper) Makes(dev string) bool {
	prefix := "/dev/rbd"
	if k.nbd {
		prefix = "/dev/nbd"
	}
	_, err := strconv.Atoi(strings.TrimPrefix(dev, prefix))
	return strings.HasPrefix(dev, prefix) && err == nil
}

// Identify finds dev among the mapped devices.
func (k *kernelMapper) Identify(ctx context.Context, _ ref, dev string) (*mapped, error) {
	all, err := k.all(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range all {
		if m.Device == dev {
			return &m, nil
		}
	}
	return nil, errdefs.NotFound("%s is not a mapped %s device", dev, k.name())
}

// all lists the mapped devices (head revisions, not snapshots).
func (k *kernelMapper) all(ctx context.Context) ([]mapped, error) {
	if k.nbd {
		return k.nbdList(ctx)
	}
	return k.krbdList()
}

// krbdList reads /sys/bus/rbd/devices/<N>/{pool,name,current_snap}; the
// device is /dev/rbd<N>. No command, so identity checks cost no fork.
func (k *kernelMapper) krbdList() ([]mapped, error) {
	root := filepath.Join(k.sysRoot, "bus", "rbd", "devices")
	entries, err := os.ReadDir(root)
	if os.IsNotExist(err) {
		return nil, nil // no rbd module: nothing mapped
	}
	if err != nil {
		return nil, err
	}
	var out []mapped
	for _, e := range entries {
		id := e.Name()
		if _, err := strconv.Atoi(id); err != nil {
			continue
		}
		attr := func(name string) (string, error) {
			b, err := os.ReadFile(filepath.Join(root, id, name))
			return strings.TrimSpace(string(b)), err
		}
		pool, err1 := attr("pool")
		name, err2 := attr("name")
		snap, err3 := attr("current_snap")
		ns, _ := attr("pool_ns") // Linux 4.19 and later; none before
		if blockdev.DeviceGone(err1) || blockdev.DeviceGone(err2) {
			continue // unmapped while we read
		}
		if err := firstError(err1, err2); err != nil {
			return nil, err
		}
		if err3 == nil && snap != "-" {
			continue
		}
		m := mapped{Device: "/dev/rbd" + id, Pool: pool, Namespace: ns, Image: name}
		if ro, err := os.ReadFile(filepath.Join(k.sysRoot, "block", "rbd"+id, "ro")); err == nil {
			m.ReadOnly = strings.TrimSpace(string(ro)) == "1"
		}
		out = append(out, m)
	}
	return out, nil
}

// firstError returns the first non-nil error of errs.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// nbdDevice is one entry of "rbd device list -t nbd --format json".
type nbdDevice struct {
	Pool      string `json:"pool"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Image     string `json:"image"`
	Snap      string `json:"snap"`
	Device    string `json:"device"`
}

// nbdListKey names this mapper's device list in a listing memo.
type nbdListKey struct{ m *kernelMapper }

// nbdList lists the rbd-nbd devices; once per inventory (a listing memo on
// ctx: the list starts a Ceph client, seconds on a slow node, and every
// staged volume's check asks for it). Callers must not change the slice.
func (k *kernelMapper) nbdList(ctx context.Context) ([]mapped, error) {
	return backend.Memoized(ctx, nbdListKey{k}, func() ([]mapped, error) { return k.listNBD(ctx) })
}

// listNBD lists the rbd-nbd devices. When every connected nbd device is
// served by an rbd-nbd this driver started ("rbd-nbd map <pool>[/<ns>]/<image>
// …"), the list comes from sysfs and /proc, as rbd's own list reads it,
// without starting a Ceph client: that took 6-35 s on make
// e2e-multinode's emulated workers, and every RBD stage asks, whatever
// its mounter. Any other nbd device sends the list to "rbd device list -t
// nbd", which knows every form of rbd-nbd's arguments.
func (k *kernelMapper) listNBD(ctx context.Context) ([]mapped, error) {
	if _, err := os.Stat(filepath.Join(k.sysRoot, "module", "nbd")); os.IsNotExist(err) {
		return nil, nil // no nbd module: nothing mapped
	}
	if list, ok := k.ownNBD(); ok {
		return list, nil
	}
	release, err := k.c.acquireSlot(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	out, err := k.c.run.Run(ctx, "rbd", "device", "list", "-t", "nbd", "--format", "json")
	if err != nil {
		return nil, err
	}
	var list []nbdDevice
	if err := json.Unmarshal(out, &list); err != nil {
		return nil, fmt.Errorf("rbd device list -t nbd: cannot parse its JSON output %.200q: %w", out, err)
	}
	var res []mapped
	for _, d := range list {
		name := d.Name
		if name == "" {
			name = d.Image
		}
		if d.Snap != "" && d.Snap != "-" {
			continue
		}
		m := mapped{Device: d.Device, Pool: d.Pool, Namespace: d.Namespace, Image: name}
		if ro, err := os.ReadFile(filepath.Join(k.sysRoot, "block", filepath.Base(d.Device), "ro")); err == nil {
			m.ReadOnly = strings.TrimSpace(string(ro)) == "1"
		}
		res = append(res, m)
	}
	return res, nil
}

// ownNBD reads the connected nbd devices (/sys/block/nbdN/pid: the process
// serving each) and their processes' command lines; ok is false unless
// each is an rbd-nbd this driver started, whose image spec follows "map".
func (k *kernelMapper) ownNBD() (list []mapped, ok bool) {
	pidFiles, err := filepath.Glob(filepath.Join(k.sysRoot, "block", "nbd*", "pid"))
	if err != nil {
		return nil, false
	}
	for _, pidFile := range pidFiles {
		pid, err := os.ReadFile(pidFile)
		if os.IsNotExist(err) {
			continue // disconnected while we read
		}
		if err != nil {
			return nil, false
		}
		cmdline, err := os.ReadFile(filepath.Join(k.procRoot, strings.TrimSpace(string(pid)), "cmdline"))
		if err != nil {
			return nil, false // gone meanwhile, or another PID namespace's
		}
		argv := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if len(argv) < 3 || filepath.Base(argv[0]) != "rbd-nbd" || argv[1] != "map" {
			return nil, false
		}
		spec := argv[2]
		if strings.Contains(spec, "@") {
			continue // a snapshot: the list is of head revisions
		}
		m := mapped{Device: "/dev/" + filepath.Base(filepath.Dir(pidFile))}
		switch parts := strings.Split(spec, "/"); len(parts) {
		case 2:
			m.Pool, m.Image = parts[0], parts[1]
		case 3:
			m.Pool, m.Namespace, m.Image = parts[0], parts[1], parts[2]
		default:
			return nil, false
		}
		if ro, err := os.ReadFile(filepath.Join(k.sysRoot, "block", filepath.Base(m.Device), "ro")); err == nil {
			m.ReadOnly = strings.TrimSpace(string(ro)) == "1"
		}
		list = append(list, m)
	}
	return list, true
}

// Refresh: krbd and rbd-nbd watch the image header and resize the device
// themselves when the image grows; Refresh reads the size the kernel has.
func (k *kernelMapper) Refresh(_ context.Context, _ ref, dev string) (int64, error) {
	return blockdev.Size(k.sysRoot, dev)
}

// Available: the kernel module is loaded, or this node loads it now
// (kmod.Ensure: the node plugin's liveness asks before the first map);
// for rbd-nbd also the attach daemon that starts it answers and has it.
func (k *kernelMapper) Available(ctx context.Context) error {
	present := filepath.Join(k.sysRoot, "bus", "rbd")
	if k.nbd {
		present = filepath.Join(k.sysRoot, "module", "nbd")
		if err := k.c.run.CheckDaemons(ctx, "rbd-nbd"); err != nil {
			return errdefs.Wrap(errdefs.ErrPrecondition, err, "this node cannot map RBD images with %s", k.name())
		}
	}
	if err := kmod.Ensure(ctx, k.c.run, present, k.module()); err != nil {
		return errdefs.Wrap(errdefs.ErrPrecondition, err, "this node cannot map RBD images with %s; use another mounter (rbd-fuse needs none)", k.name())
	}
	return nil
}
