// Package kmod loads the kernel modules a node's attach path needs.
//
// A node's rbd, nbd and iscsi_tcp modules are usually not loaded before the
// first attach (the rbd CLI and iscsid load them then), but the node
// plugin's liveness probe asks whether the node can attach before that:
// answering "no" would restart the plugin until something else loaded the
// module. So the probe loads it, as the first attach would.
package kmod

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spindle-csi/spindle/internal/command"
)

// loadTimeout bounds one modprobe: resolving and inserting a module and its
// dependencies takes milliseconds, seconds on an emulated guest.
const loadTimeout = 30 * time.Second

// Ensure makes sure module is loaded: present is the path that exists once
// it is (/sys/module/<name>, or what the module registers, like
// /sys/bus/rbd). When present is missing it runs "modprobe module"; the
// error names the module and carries modprobe's own answer (a kernel built
// without it: "modprobe: FATAL: Module rbd not found in directory
// /lib/modules/..."; a node plugin without the host's /lib/modules
// mounted fails the same way).
func Ensure(ctx context.Context, run *command.Runner, present, module string) error {
	if _, err := os.Stat(present); err == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	if _, err := run.Run(ctx, "modprobe", module); err != nil {
		return fmt.Errorf("the %q kernel module is not loaded (%s is missing) and modprobe could not load it: %w", module, present, err)
	}
	if _, err := os.Stat(present); err != nil {
		return fmt.Errorf("modprobe %s succeeded but %s is still missing", module, present)
	}
	return nil
}
