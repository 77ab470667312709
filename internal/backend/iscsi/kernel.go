package iscsi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spindle-csi/spindle/internal/atomicfile"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/kmod"
)

// kernel logs in with open-iscsi (iscsiadm, iscsid, the iscsi_tcp module).
// It logs in through an iface of its own whose iface.initiatorname is the
// node's derived initiator name, so the rest of the node's iSCSI setup is
// left alone. Sessions are counted per target in <stateDir>/sessions.json
// (which LUNs of the target this node uses): a detach logs out only when the
// target's last LUN is released, so it never cuts another volume's device.
type kernel struct {
	run      *command.Runner
	stateDir string
	sysRoot  string // "/sys"
	devRoot  string // "/dev"
	iface    string
	// deviceWait bounds the wait for udev's by-path link after a login.
	deviceWait time.Duration
	mu         sync.Mutex
}

func newKernel(run *command.Runner, stateDir string) *kernel {
	return &kernel{run: run, stateDir: stateDir, sysRoot: "/sys", devRoot: "/dev", iface: "spindle", deviceWait: 15 * time.Second}
}

// iscsiadm exit statuses (open-iscsi's include/iscsi_err.h).
const (
	iscsiErrIDBM        = 6  // the record database: e.g. no such iface
	iscsiErrNoDriver    = 12 // "iSCSI driver not found"
	iscsiErrSessExists  = 15
	iscsiErrNonRetry    = 19 // login refused: target not found, not allowed
	iscsiErrNoIscsid    = 20
	iscsiErrNoObjsFound = 21
	iscsiErrLoginAuth   = 24
)

// sessionRefs is the node's count of LUNs in use per target.
type sessionRefs map[string]*targetRefs

type targetRefs struct {
	Portal string `json:"portal"`
	LUNs   []int  `json:"luns"`
}

func (k *kernel) refsPath() string { return filepath.Join(k.stateDir, "sessions.json") }

func (k *kernel) readRefs() (sessionRefs, error) {
	refs := sessionRefs{}
	data, err := os.ReadFile(k.refsPath())
	if os.IsNotExist(err) {
		return refs, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, &refs); err != nil {
		return nil, fmt.Errorf("session counts %s are corrupt: %w", k.refsPath(), err)
	}
	return refs, nil
}

func (k *kernel) writeRefs(refs sessionRefs) error {
	if err := os.MkdirAll(k.stateDir, 0o700); err != nil {
		return err
	}
	data, err := json.MarshalIndent(refs, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(k.refsPath(), append(data, '\n'), 0o600)
}

// moduleLoaded loads iscsi_tcp if it is not loaded yet (kmod.Ensure: the
// probe comes before the first login, which would have iscsid load it).
func (k *kernel) moduleLoaded(ctx context.Context) error {
	if err := kmod.Ensure(ctx, k.run, filepath.Join(k.sysRoot, "module", "iscsi_tcp"), "iscsi_tcp"); err != nil {
		return errdefs.Wrap(errdefs.ErrPrecondition, err, "this node's kernel has no iSCSI initiator (configure attachMode: userspace if it cannot have one)")
	}
	return nil
}

func (k *kernel) Probe(ctx context.Context) error {
	if err := k.moduleLoaded(ctx); err != nil {
		return err
	}
	if _, err := exec.LookPath("iscsiadm"); err != nil {
		return errdefs.Unavailable("iscsiadm is not installed on this node (Debian package open-iscsi)")
	}
	return nil
}

func (k *kernel) adm(ctx context.Context, args ...string) (string, error) {
	out, err := k.run.Run(ctx, "iscsiadm", args...)
	return string(out), err
}

func (k *kernel) node(iqn, portal string, args ...string) []string {
	return append([]string{"-m", "node", "-T", iqn, "-p", portal, "-I", k.iface}, args...)
}

// Connect logs in (once per target) and returns the LUN's disk.
func (k *kernel) Connect(ctx context.Context, s session) (*connDevice, error) {
	if err := k.moduleLoaded(ctx); err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	refs, err := k.readRefs()
	if err != nil {
		return nil, err
	}
	if err := k.ensureIface(ctx, s.Initiator); err != nil {
		return nil, err
	}
	var errs []error
	for _, portal := range s.Portals {
		d, err := k.connectVia(ctx, s, portal, refs)
		if err == nil {
			return d, nil
		}
		if errdefs.KindOf(err) != errdefs.ErrUnavailable {
			return nil, err
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// ensureIface makes the "spindle" iface carry the node's initiator name.
func (k *kernel) ensureIface(ctx context.Context, initiator string) error {
	out, err := k.adm(ctx, "-m", "iface", "-I", k.iface, "-o", "show")
	if ifaceMissing(err) {
		if _, err := k.adm(ctx, "-m", "iface", "-I", k.iface, "-o", "new"); err != nil {
			return k.admError(err, session{Initiator: initiator}, "")
		}
		out, err = "", nil
	}
	if err != nil {
		return k.admError(err, session{Initiator: initiator}, "")
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "iface.initiatorname = "); ok && v == initiator {
			return nil
		}
	}
	if _, err := k.adm(ctx, "-m", "iface", "-I", k.iface, "-o", "update", "-n", "iface.initiatorname", "-v", initiator); err != nil {
		return k.admError(err, session{Initiator: initiator}, "")
	}
	return nil
}

// ifaceMissing: open-iscsi 2.1.8 (Debian 12) answers `-m iface -I NAME -o
// show` for an iface it has no record of with exit 6 (ISCSI_ERR_IDBM) and
// "Failed to open /etc/iscsi/ifaces/NAME using read mode: 2 No such file or
// directory"; other versions with 21 (ISCSI_ERR_NO_OBJS_FOUND).
func ifaceMissing(err error) bool {
	switch command.ExitCode(err) {
	case iscsiErrNoObjsFound:
		return true
	case iscsiErrIDBM:
		return strings.Contains(command.Stderr(err), "No such file or directory")
	}
	return false
}

func (k *kernel) connectVia(ctx context.Context, s session, portal string, refs sessionRefs) (*connDevice, error) {
	out, err := k.adm(ctx, "-m", "discovery", "-t", "sendtargets", "-p", portal, "-I", k.iface)
	if err != nil && command.ExitCode(err) != iscsiErrNoObjsFound {
		return nil, k.admError(err, s, portal)
	}
	if !discovered(out, s.IQN) {
		return nil, errdefs.NotFound("target %s not found at portal %s for initiator %s (is the volume published to this node?)", s.IQN, portal, s.Initiator)
	}
	method := "None"
	if s.CHAP != nil {
		method = "CHAP"
	}
	if _, err := k.adm(ctx, k.node(s.IQN, portal, "-o", "update", "-n", "node.session.auth.authmethod", "-v", method)...); err != nil {
		return nil, k.admError(err, s, portal)
	}
	if s.CHAP != nil {
		settings := [][2]string{{SecretUser, s.CHAP.User}, {SecretPassword, s.CHAP.Password}}
		if s.CHAP.Mutual() {
			settings = append(settings, [2]string{SecretMutualUser, s.CHAP.MutualUser}, [2]string{SecretMutualPassword, s.CHAP.MutualPassword})
		}
		for _, kv := range settings {
			// iscsiadm takes the values on its command line only; keep
			// them out of errors and logs at least.
			_, err := k.run.Exec(ctx, command.Cmd{Name: "iscsiadm", Args: k.node(s.IQN, portal, "-o", "update", "-n", kv[0], "-v", kv[1]), SecretArgs: true})
			if err != nil {
				// Not even iscsiadm's stderr: it may echo the value.
				return nil, errdefs.Unavailable("iscsiadm could not set %s of target %s (exit status %d)", kv[0], s.IQN, command.ExitCode(err))
			}
		}
	}
	if _, err := k.adm(ctx, k.node(s.IQN, portal, "--login")...); err != nil && command.ExitCode(err) != iscsiErrSessExists {
		return nil, k.admError(err, s, portal)
	}
	t := refs[s.IQN]
	if t == nil {
		t = &targetRefs{Portal: portal}
		refs[s.IQN] = t
	}
	fresh := len(t.LUNs) == 0
	counted := slices.Contains(t.LUNs, s.LUN)
	if !counted {
		t.LUNs = append(t.LUNs, s.LUN)
		slices.Sort(t.LUNs)
	}
	if err := k.writeRefs(refs); err != nil {
		return nil, err
	}
	d, err := k.provenDevice(ctx, s, portal, fresh)
	if err != nil && !counted {
		// Leave nothing behind: a LUN that did not prove itself is not
		// counted, and a login made for it alone is undone. (A LUN that
		// was already attached stays counted: its user still has it.)
		return nil, errors.Join(err, k.forget(ctx, refs, s.IQN, s.LUN))
	}
	return d, err
}

// provenDevice waits for the LUN's disk and proves it by its serial.
func (k *kernel) provenDevice(ctx context.Context, s session, portal string, fresh bool) (*connDevice, error) {
	dev, err := k.awaitDevice(ctx, portal, s.IQN, s.LUN)
	if err != nil {
		return nil, err
	}
	d, err := k.identify(s.IQN, s.Serial, dev)
	if err != nil {
		return nil, errdefs.Precondition("%s appeared for LUN %d of target %s but %v; refusing to use it", dev, s.LUN, s.IQN, err)
	}
	switch {
	case s.ReadOnly && !d.ReadOnly && fresh:
		if _, err := k.run.Run(ctx, "blockdev", "--setro", dev); err != nil {
			return nil, err
		}
		d.ReadOnly = true
	case s.ReadOnly != d.ReadOnly:
		return nil, errdefs.Precondition("LUN %d of target %s is attached on this node as %s with read-only=%t; the kernel initiator gives one device per LUN", s.LUN, s.IQN, dev, d.ReadOnly)
	}
	return d, nil
}

// discovered reports whether sendtargets output ("127.0.0.1:3260,1 iqn...")
// lists iqn.
func discovered(out, iqn string) bool {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == iqn {
			return true
		}
	}
	return false
}

// admError turns iscsiadm's failures into errors of a kind, naming the
// target and initiator, never a credential.
func (k *kernel) admError(err error, s session, portal string) error {
	stderr := command.Stderr(err)
	switch code := command.ExitCode(err); {
	case code == iscsiErrNoDriver || strings.Contains(stderr, "iSCSI driver not found"):
		return errdefs.Wrap(errdefs.ErrPrecondition, err, "this node's kernel has no iSCSI initiator: the iscsi_tcp module is not loaded (modprobe iscsi_tcp, or configure attachMode: userspace)")
	case code == iscsiErrLoginAuth:
		// iscsiadm gives one status for a failed authentication (CHAP) and
		// for a failed authorization, which is how LIO refuses an initiator
		// outside the ACL (tgt answers "not found" instead).
		return errdefs.Wrap(errdefs.ErrPrecondition, err, "CHAP authentication of initiator %s to target %s failed: the NodeStageVolume secrets do not match the target's account, or (on LIO) the initiator is not in the target's ACL (is the volume published to this node?)", s.Initiator, s.IQN)
	case code == iscsiErrNonRetry, code == iscsiErrNoObjsFound:
		return errdefs.Wrap(errdefs.ErrNotFound, err, "target %s at portal %s does not let initiator %s log in (not found, or not in its ACL: is the volume published to this node?)", s.IQN, portal, s.Initiator)
	case code == iscsiErrNoIscsid:
		return errdefs.Wrap(errdefs.ErrUnavailable, err, "iscsid is not running on this node")
	case s.IQN == "":
		// Before any target: setting up the node's iface.
		return errdefs.Wrap(errdefs.ErrUnavailable, err, "iscsiadm could not set up the iface of initiator %s", s.Initiator)
	default:
		return errdefs.Wrap(errdefs.ErrUnavailable, err, "iscsiadm failed for target %s at portal %s", s.IQN, portal)
	}
}

// byPath is udev's link for a LUN.
func (k *kernel) byPath(portal, iqn string, lun int) string {
	return filepath.Join(k.devRoot, "disk", "by-path", fmt.Sprintf("ip-%s-iscsi-%s-lun-%d", portal, iqn, lun))
}

func (k *kernel) awaitDevice(ctx context.Context, portal, iqn string, lun int) (string, error) {
	link := k.byPath(portal, iqn, lun)
	deadline := time.Now().Add(k.deviceWait)
	for {
		dev, err := filepath.EvalSymlinks(link)
		if err == nil {
			return dev, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", errdefs.Unavailable("logged in to target %s but %s did not appear within %s", iqn, link, k.deviceWait)
		}
		time.Sleep(pollEvery)
	}
}

// identify reads the disk's unit serial number (VPD page 0x80: a 4-byte
// header, then the serial) and read-only flag from sysfs.
func (k *kernel) identify(iqn, serial, dev string) (*connDevice, error) {
	name := filepath.Base(dev)
	if filepath.Join(k.devRoot, name) != dev || strings.Contains(name, "..") {
		return nil, errdefs.NotFound("%s is not a disk of target %s", dev, iqn)
	}
	data, err := os.ReadFile(filepath.Join(k.sysRoot, "block", name, "device", "vpd_pg80"))
	if err != nil {
		return nil, errdefs.NotFound("%s has no unit serial number to prove it is LUN of target %s: %v", dev, iqn, err)
	}
	got := ""
	if len(data) > 4 {
		// tgt right-aligns the serial in its field: leading spaces too.
		got = strings.Trim(string(data[4:]), " \x00\n")
	}
	if got != serial {
		return nil, errdefs.NotFound("%s has serial %q, not %q of target %s", dev, got, serial, iqn)
	}
	ro, err := os.ReadFile(filepath.Join(k.sysRoot, "block", name, "ro"))
	if err != nil {
		return nil, errdefs.NotFound("%s: %v", dev, err)
	}
	return &connDevice{Path: dev, ReadOnly: strings.TrimSpace(string(ro)) == "1"}, nil
}

// devices lists the target's disks by their by-path links: path -> LUN.
func (k *kernel) devices(iqn string) (map[string]int, error) {
	links, err := filepath.Glob(filepath.Join(k.devRoot, "disk", "by-path", "ip-*-iscsi-"+iqn+"-lun-*"))
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, l := range links {
		i := strings.LastIndex(l, "-lun-")
		lun, err := strconv.Atoi(l[i+len("-lun-"):])
		if err != nil {
			continue // a partition link ("-lun-1-part1")
		}
		if dev, err := filepath.EvalSymlinks(l); err == nil {
			out[dev] = lun
		}
	}
	return out, nil
}

func (k *kernel) Devices(_ context.Context, iqn, serial string) ([]connDevice, error) {
	devs, err := k.devices(iqn)
	if err != nil {
		return nil, err
	}
	var out []connDevice
	for _, dev := range slices.Sorted(maps.Keys(devs)) {
		if d, err := k.identify(iqn, serial, dev); err == nil {
			out = append(out, *d)
		}
	}
	return out, nil
}

func (k *kernel) Identify(_ context.Context, iqn, serial, dev string) (*connDevice, error) {
	devs, err := k.devices(iqn)
	if err != nil {
		return nil, err
	}
	if _, ok := devs[dev]; !ok {
		return nil, errdefs.NotFound("%s is not a disk of target %s on this node", dev, iqn)
	}
	return k.identify(iqn, serial, dev)
}

// Disconnect removes the LUN's disk dev from the kernel (flushing it) and
// stops counting its LUN against the target's session.
func (k *kernel) Disconnect(_ context.Context, iqn, serial, dev string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	devs, err := k.devices(iqn)
	if err != nil {
		return err
	}
	lun, ok := devs[dev]
	if !ok {
		return nil // no longer a disk of the target
	}
	if _, err := k.identify(iqn, serial, dev); err != nil {
		return nil // never touch a disk not proven to be the LUN
	}
	if busy, _ := blockdev.InUse(dev); busy {
		return errdefs.Precondition("%s (LUN %d of target %s) is still in use (mounted or held open exclusively)", dev, lun, iqn)
	}
	del := filepath.Join(k.sysRoot, "block", filepath.Base(dev), "device", "delete")
	if err := os.WriteFile(del, []byte("1"), 0o200); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove %s from the kernel: %w", dev, err)
	}
	refs, err := k.readRefs()
	if err != nil {
		return err
	}
	if t := refs[iqn]; t != nil {
		t.LUNs = slices.DeleteFunc(t.LUNs, func(l int) bool { return l == lun })
		return k.writeRefs(refs)
	}
	return nil
}

// Release logs out of the target once no LUN of it is in use on this node
// (a session Spindle did not log in is not its to end).
func (k *kernel) Release(ctx context.Context, iqn string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	refs, err := k.readRefs()
	if err != nil {
		return err
	}
	return k.logoutUnused(ctx, refs, iqn)
}

// forget drops lun from the target's count and logs out if it was the
// target's last; k.mu is held.
func (k *kernel) forget(ctx context.Context, refs sessionRefs, iqn string, lun int) error {
	if t := refs[iqn]; t != nil {
		t.LUNs = slices.DeleteFunc(t.LUNs, func(l int) bool { return l == lun })
	}
	if err := k.writeRefs(refs); err != nil {
		return err
	}
	return k.logoutUnused(ctx, refs, iqn)
}

// logoutUnused logs out of a target Spindle logged in to once none of its
// LUNs is in use; k.mu is held.
func (k *kernel) logoutUnused(ctx context.Context, refs sessionRefs, iqn string) error {
	t := refs[iqn]
	if t == nil {
		return nil // not logged in by us
	}
	if len(t.LUNs) > 0 {
		return nil // another LUN of the target is still in use
	}
	s := session{IQN: iqn}
	if _, err := k.adm(ctx, k.node(iqn, t.Portal, "--logout")...); err != nil && command.ExitCode(err) != iscsiErrNoObjsFound {
		return k.admError(err, s, t.Portal)
	}
	if _, err := k.adm(ctx, k.node(iqn, t.Portal, "-o", "delete")...); err != nil && command.ExitCode(err) != iscsiErrNoObjsFound {
		return k.admError(err, s, t.Portal)
	}
	delete(refs, iqn)
	return k.writeRefs(refs)
}

// Refresh rescans the target's session, so the disk takes the LUN's new
// capacity, and returns the disk's size.
func (k *kernel) Refresh(ctx context.Context, s session, dev string) (int64, error) {
	refs, err := k.readRefs()
	if err != nil {
		return 0, err
	}
	t := refs[s.IQN]
	if t == nil {
		return 0, errdefs.NotFound("this node has no session with target %s", s.IQN)
	}
	if _, err := k.adm(ctx, k.node(s.IQN, t.Portal, "--rescan")...); err != nil {
		return 0, k.admError(err, s, t.Portal)
	}
	return blockdev.Size(k.sysRoot, dev)
}
