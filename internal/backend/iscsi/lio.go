package iscsi

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// lio administers the kernel's LIO target with targetcli (targetcli-fb)
// and reads its state from configfs, which is what targetcli itself reads.
// Each volume gets a fileio backstore named by its LUN serial, which is
// also the backstore's WWN (the unit serial a node checks), and target
// portal group 1 with LUN 1, node ACLs per initiator and CHAP per ACL.
// The credentials go to targetcli on stdin, never on its command line.
// Every change ends with "saveconfig", so LIO rebuilds it at boot.
//
// LIO cannot run on the development machine (no configfs): it is tested
// with scripted commands here and for real in make vmtest's guest.
type lio struct {
	run      *command.Runner
	configfs string // "/sys/kernel/config/target"
	mu       sync.Mutex
}

func newLIO(run *command.Runner) *lio {
	return &lio{run: run, configfs: "/sys/kernel/config/target"}
}

func (l *lio) cli(ctx context.Context, args ...string) error {
	_, err := l.run.Run(ctx, "targetcli", args...)
	return err
}

func (l *lio) tpg(iqn string) string { return "/iscsi/" + iqn + "/tpg1" }

func (l *lio) targetDir(iqn string) string {
	return filepath.Join(l.configfs, "iscsi", iqn, "tpgt_1")
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func (l *lio) Probe(context.Context) error {
	if !exists(filepath.Join(l.configfs, "iscsi")) {
		return errdefs.Unavailable("LIO is not available on this host: %s is missing (configfs not mounted, or the iscsi_target_mod module not loaded)", filepath.Join(l.configfs, "iscsi"))
	}
	return nil
}

func (l *lio) Targets(context.Context) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(l.configfs, "iscsi"))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrUnavailable, err, "read LIO's targets")
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && strings.Contains(e.Name(), ":") {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// backstore finds the fileio backstore named name: its configfs directory.
func (l *lio) backstore(name string) string {
	dirs, _ := filepath.Glob(filepath.Join(l.configfs, "core", "fileio_*", name))
	if len(dirs) == 0 {
		return ""
	}
	return dirs[0]
}

func (l *lio) Apply(ctx context.Context, e Export) error {
	if err := l.Probe(ctx); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	name := e.Serial
	if l.backstore(name) == "" {
		if err := l.cli(ctx, "/backstores/fileio", "create", "name="+name, "file_or_dev="+e.ImagePath, "write_back=false", "wwn="+e.Serial); err != nil {
			return fmt.Errorf("create the backstore of %s: %w", e.IQN, err)
		}
	}
	dir := l.targetDir(e.IQN)
	if !exists(dir) {
		if err := l.cli(ctx, "/iscsi", "create", e.IQN); err != nil {
			return fmt.Errorf("create target %s: %w", e.IQN, err)
		}
		// Only listed initiators, each with its own mapped LUNs; and only
		// they discover the target (LIO's SendTargets lists every target to
		// anyone unless demo_mode_discovery is off; tgt hides it by ACL).
		if err := l.cli(ctx, l.tpg(e.IQN), "set", "attribute", "generate_node_acls=0", "demo_mode_write_protect=1", "demo_mode_discovery=0"); err != nil {
			return err
		}
	}
	if !exists(filepath.Join(dir, "lun", fmt.Sprintf("lun_%d", LUN))) {
		if err := l.cli(ctx, l.tpg(e.IQN)+"/luns", "create", "/backstores/fileio/"+name, fmt.Sprintf("lun=%d", LUN), "add_mapped_luns=false"); err != nil {
			return fmt.Errorf("add LUN %d of %s: %w", LUN, e.IQN, err)
		}
	}
	current := []string{}
	if entries, err := os.ReadDir(filepath.Join(dir, "acls")); err == nil {
		for _, a := range entries {
			current = append(current, a.Name())
		}
	}
	// Deleting a node ACL also ends that initiator's sessions.
	for _, a := range current {
		if !slices.Contains(e.Initiators, a) {
			if err := l.cli(ctx, l.tpg(e.IQN)+"/acls", "delete", a); err != nil {
				return fmt.Errorf("remove %s from the ACL of %s: %w", a, e.IQN, err)
			}
		}
	}
	for _, a := range e.Initiators {
		if !slices.Contains(current, a) {
			if err := l.cli(ctx, l.tpg(e.IQN)+"/acls", "create", a, "add_mapped_luns=true"); err != nil {
				return fmt.Errorf("add %s to the ACL of %s: %w", a, e.IQN, err)
			}
		}
	}
	if !e.CHAP.keep() {
		if err := l.applyCHAP(ctx, e); err != nil {
			return err
		}
	}
	return l.cli(ctx, "saveconfig")
}

// applyCHAP sets authentication on the portal group and the credentials of
// every ACL, through targetcli's stdin.
func (l *lio) applyCHAP(ctx context.Context, e Export) error {
	if e.CHAP == nil {
		return l.cli(ctx, l.tpg(e.IQN), "set", "attribute", "authentication=0")
	}
	if err := l.cli(ctx, l.tpg(e.IQN), "set", "attribute", "authentication=1"); err != nil {
		return err
	}
	var script strings.Builder
	for _, a := range e.Initiators {
		fmt.Fprintf(&script, "%s/acls/%s set auth userid=%s password=%s", l.tpg(e.IQN), a, e.CHAP.User, e.CHAP.Password)
		if e.CHAP.Mutual() {
			fmt.Fprintf(&script, " mutual_userid=%s mutual_password=%s", e.CHAP.MutualUser, e.CHAP.MutualPassword)
		}
		script.WriteString("\n")
	}
	script.WriteString("exit\n")
	if _, err := l.run.Exec(ctx, command.Cmd{Name: "targetcli", Stdin: []byte(script.String())}); err != nil {
		// targetcli's output may echo the script: keep it out.
		return errdefs.Unavailable("targetcli could not set the CHAP credentials of %s (exit status %d)", e.IQN, command.ExitCode(err))
	}
	return nil
}

func (l *lio) Remove(ctx context.Context, iqn string) error {
	if err := l.Probe(ctx); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	dir := l.targetDir(iqn)
	if !exists(filepath.Dir(dir)) {
		return nil
	}
	// The LUN's link names the backstore, which goes with the target.
	var backstore string
	lunDir := filepath.Join(dir, "lun", fmt.Sprintf("lun_%d", LUN))
	if entries, err := os.ReadDir(lunDir); err == nil {
		for _, e := range entries {
			if target, err := os.Readlink(filepath.Join(lunDir, e.Name())); err == nil {
				backstore = filepath.Base(target)
			}
		}
	}
	if err := l.cli(ctx, "/iscsi", "delete", iqn); err != nil {
		return fmt.Errorf("delete target %s: %w", iqn, err)
	}
	if backstore != "" {
		if err := l.cli(ctx, "/backstores/fileio", "delete", backstore); err != nil {
			return fmt.Errorf("delete the backstore of %s: %w", iqn, err)
		}
	}
	return l.cli(ctx, "saveconfig")
}

// Resize: a fileio backstore over a regular file reports the size it was
// created with (its fd_dev_size), not the file's, and targetcli has no
// command to change it. But LIO reads fd_dev_size on every READ CAPACITY
// and takes a new one through the device's configfs control attribute
// while the LUN stays mapped, so the initiator's rescan sees the grown
// image (make vmtest, kernel/lio). saveconfig then records the new size
// for the next boot. An unpublished volume has no target: its next
// publish creates the backstore at the file's size.
func (l *lio) Resize(ctx context.Context, e Export) error {
	if !exists(l.targetDir(e.IQN)) {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	dir := l.backstore(e.Serial)
	if dir == "" {
		return fmt.Errorf("target %s has no fileio backstore %s to resize", e.IQN, e.Serial)
	}
	st, err := os.Stat(e.ImagePath)
	if err != nil {
		return fmt.Errorf("resize the LUN of %s: %w", e.IQN, err)
	}
	control := filepath.Join(dir, "control")
	if err := os.WriteFile(control, []byte(fmt.Sprintf("fd_dev_size=%d", st.Size())), 0o644); err != nil {
		return fmt.Errorf("resize the LUN of %s to %d bytes (%s): %w", e.IQN, st.Size(), control, err)
	}
	return l.cli(ctx, "saveconfig")
}
