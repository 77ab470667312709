package loop

import "github.com/spindle-csi/spindle/internal/command"

// Devices is the kernel's loop driver as other backends' attachers use it
// (the rbd backend binds loop devices to rbd-fuse files): the same
// losetup and sysfs code as the loop backend's, so there is one of it.
type Devices = loopDevices

// NewDevices returns the real loop driver, running losetup through run.
func NewDevices(run *command.Runner) Devices { return newLosetup(run) }
