package blockdev

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Opener is a process that has a device open.
type Opener struct {
	PID int
	// Command is the process's name as /proc/PID/comm has it (at most 15
	// bytes: "mkfs.ext4"), "" when it could not be read.
	Command string
}

func (o Opener) String() string {
	if o.Command == "" {
		return "pid " + strconv.Itoa(o.PID)
	}
	return fmt.Sprintf("pid %d (%s)", o.PID, o.Command)
}

// Openers lists the processes that have the block device dev open, from
// the file descriptors under procRoot (/proc): a descriptor whose link
// names dev, or that leads to a block device of dev's number. It sees the
// processes of the caller's PID namespace (the node plugin runs with the
// host's), and only those whose descriptors it may read; a process that
// exits meanwhile is skipped. It reads every process's descriptors, so
// callers ask only when something already refused to go ahead.
func Openers(procRoot, dev string) ([]Opener, error) {
	var want unix.Stat_t
	if err := unix.Stat(dev, &want); err != nil {
		return nil, &os.PathError{Op: "stat", Path: dev, Err: err}
	}
	if want.Mode&unix.S_IFMT != unix.S_IFBLK {
		return nil, fmt.Errorf("%s is not a block device", dev)
	}
	return openers(procRoot, dev, want.Rdev)
}

// openers is Openers for a device of number rdev at path dev.
func openers(procRoot, dev string, rdev uint64) ([]Opener, error) {
	procs, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	var out []Opener
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid <= 0 {
			continue // not a process: /proc/self, /proc/mounts, ...
		}
		if holds(filepath.Join(procRoot, p.Name(), "fd"), dev, rdev) {
			out = append(out, Opener{PID: pid, Command: processName(filepath.Join(procRoot, p.Name(), "comm"))})
		}
	}
	return out, nil
}

// holds reports whether one of the descriptors in fdDir is the device.
func holds(fdDir, dev string, rdev uint64) bool {
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return false // gone, or not ours to read
	}
	for _, fd := range fds {
		link := filepath.Join(fdDir, fd.Name())
		if target, err := os.Readlink(link); err == nil && target == dev {
			return true
		}
		var st unix.Stat_t
		if err := unix.Stat(link, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == rdev {
			return true
		}
	}
	return false
}

// processName reads /proc/PID/comm; "" when it cannot.
func processName(commPath string) string {
	b, err := os.ReadFile(commPath)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
