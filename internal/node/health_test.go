package node

import (
	"context"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/backend"
)

// healthWorld is a node with an ext4 volume staged and published and a
// block volume staged and published, for the health checks.
type healthWorld struct {
	*world
	fs, blk *testVolume
}

func newHealthWorld(t *testing.T) *healthWorld {
	w := &healthWorld{world: newWorld(t)}
	w.fs = w.newVolume("pvc-health", backend.AccessMount, backend.SingleNodeWriter, false)
	w.blk = w.newVolume("pvc-health-block", backend.AccessBlock, backend.SingleNodeWriter, false)
	for _, tv := range []*testVolume{w.fs, w.blk} {
		w.mustStage(tv)
		w.mustPublish(tv, tv.target, false)
	}
	return w
}

func TestCheckVolumeHealth(t *testing.T) {
	const fsDev, blkDev = "/dev/loop0", "/dev/loop1"
	tests := []struct {
		name     string
		setup    func(w *healthWorld)
		block    bool
		staging  string // "fs" or "blk" for their staging paths; "" none
		publish  string // "fs" or "blk" for their targets, or a path
		dev      string // default: the volume's own
		want     []string
		mentions []string
	}{
		{name: "staged ext4, healthy", staging: "fs"},
		{name: "staged and published, healthy", staging: "fs", publish: "fs"},
		{name: "a read-only bind of a writable stage, healthy", staging: "fs", publish: "fs-ro",
			setup: func(w *healthWorld) { w.mustPublish(w.fs, w.fs.target+"-ro", true) }},
		{name: "staging path holds nothing", staging: "fs",
			setup: func(w *healthWorld) { _ = w.host.Unmount(context.Background(), w.fs.staging) },
			want:  []string{ReasonStagingMountMissing}, mentions: []string{"nothing is mounted at staging path"}},
		{name: "staging path gone; the pod's bind lives on", staging: "fs", publish: "fs",
			setup: func(w *healthWorld) {
				_ = w.host.Unmount(context.Background(), w.fs.staging)
				_ = w.host.Remove(w.fs.staging)
			},
			want: []string{ReasonStagingMountMissing}, mentions: []string{"does not exist"}},
		{name: "staging path holds another device", staging: "fs", dev: blkDev,
			want: []string{ReasonStagingMountWrongDevice}, mentions: []string{"holds ext4 on " + fsDev + ", not the volume's device " + blkDev}},
		{name: "staging mount dead", staging: "fs", publish: "fs",
			setup: func(w *healthWorld) { w.host.KillMount(w.fs.staging) },
			want:  []string{ReasonMountCorrupted}, mentions: []string{"staging path", "is dead"}},
		{name: "both dead (an xfs that shut down answers EIO everywhere)", staging: "fs", publish: "fs",
			setup: func(w *healthWorld) { w.host.KillMount(w.fs.staging); w.host.KillMount(w.fs.target) },
			want:  []string{ReasonMountCorrupted, ReasonMountCorrupted}},
		{name: "ext4 made read-only by the kernel: said once for the stage and its bind", staging: "fs", publish: "fs",
			setup: func(w *healthWorld) { w.host.MakeKernelReadOnly(w.fs.staging) },
			want:  []string{ReasonFilesystemReadOnly}, mentions: []string{"made read-only by the kernel", "emergency_ro"}},
		{name: "device node gone; the mounts still name it", staging: "fs", publish: "fs",
			setup: func(w *healthWorld) { delete(w.loops.Devices, fsDev) },
			want:  []string{ReasonDeviceMissing, ReasonStagingMountWrongDevice, ReasonPublishMountWrongDevice}, mentions: []string{"device " + fsDev + " does not exist"}},
		{name: "device path is no device", staging: "fs", dev: "/dev/not-a-device",
			setup: func(w *healthWorld) { w.host.WriteEntry("/dev/not-a-device", 0, nil) },
			want:  []string{ReasonDeviceMissing, ReasonStagingMountWrongDevice}, mentions: []string{"not a block device"}},
		{name: "loop device detached: size 0", block: true, staging: "blk", dev: blkDev,
			setup: func(w *healthWorld) { w.loops.Sizes[blkDev] = 0 },
			want:  []string{ReasonDeviceMissing}, mentions: []string{"attached to nothing"}},
		{name: "publish path holds nothing", staging: "fs", publish: "/var/lib/kubelet/pods/none/mount",
			setup: func(w *healthWorld) { _ = w.host.MakeDir("/var/lib/kubelet/pods/none/mount") },
			want:  []string{ReasonPublishMountMissing}, mentions: []string{"nothing is mounted at publish path"}},
		{name: "publish path holds another volume's filesystem", staging: "fs", publish: "other",
			setup: func(w *healthWorld) {
				other := w.newVolume("pvc-other", backend.AccessMount, backend.SingleNodeWriter, false)
				w.mustStage(other)
				w.mustPublish(other, "/var/lib/kubelet/pods/other/mount", false)
			},
			want: []string{ReasonPublishMountWrongDevice}, mentions: []string{"holds ext4 on /dev/loop2"}},
		{name: "block volume bound, healthy", block: true, staging: "blk", publish: "blk", dev: blkDev},
		{name: "block volume: the file is no longer bound", block: true, publish: "blk", dev: blkDev,
			setup: func(w *healthWorld) { _ = w.host.Unmount(context.Background(), w.blk.target) },
			want:  []string{ReasonPublishMountMissing}, mentions: []string{"not a device node"}},
		{name: "block volume: another device bound", block: true, publish: "blk", dev: fsDev,
			want: []string{ReasonPublishMountWrongDevice}, mentions: []string{"is device 7:1, not the volume's device " + fsDev + " (7:0)"}},
		{name: "block volume: publish file gone", block: true, publish: "/var/lib/kubelet/gone", dev: blkDev,
			want: []string{ReasonPublishMountMissing}, mentions: []string{"does not exist"}},
		{name: "block volume: dead bind", block: true, publish: "blk", dev: blkDev,
			setup: func(w *healthWorld) { w.host.KillMount(w.blk.target) },
			want:  []string{ReasonMountCorrupted}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newHealthWorld(t)
			if tc.setup != nil {
				tc.setup(w)
			}
			paths := map[string]string{"fs": w.fs.staging, "blk": w.blk.staging}
			targets := map[string]string{"fs": w.fs.target, "blk": w.blk.target, "fs-ro": w.fs.target + "-ro", "other": "/var/lib/kubelet/pods/other/mount"}
			publish := tc.publish
			if p, ok := targets[publish]; ok {
				publish = p
			}
			dev := tc.dev
			if dev == "" {
				dev = fsDev
			}
			problems, err := w.v.checkHealth(dev, paths[tc.staging], publish, tc.block)
			if err != nil {
				t.Fatal(err)
			}
			var reasons []string
			for _, p := range problems {
				reasons = append(reasons, p.Reason)
			}
			if !slices.Equal(reasons, tc.want) {
				t.Fatalf("problems %q, want reasons %q", problems, tc.want)
			}
			for _, m := range tc.mentions {
				if !slices.ContainsFunc(problems, func(p HealthProblem) bool { return strings.Contains(p.Message, m) }) {
					t.Errorf("no message mentions %q: %q", m, problems)
				}
			}
		})
	}
}

// Health as the RPC asks it: the device found from the stage record, or
// from the volume's devices when kubelet names no staging path.
func TestHealth(t *testing.T) {
	w := newHealthWorld(t)
	ctx := context.Background()
	for _, tc := range []struct {
		vol              *testVolume
		staging, publish string
	}{{w.fs, w.fs.staging, w.fs.target}, {w.fs, "", ""}, {w.blk, w.blk.staging, w.blk.target}} {
		if problems, err := w.v.Health(ctx, tc.vol.Volume, tc.staging, tc.publish); err != nil || len(problems) != 0 {
			t.Errorf("Health(%s, %q, %q) = %q, %v; want healthy", tc.vol.ID, tc.staging, tc.publish, problems, err)
		}
	}
	gone := w.newVolume("pvc-never-staged", backend.AccessMount, backend.SingleNodeWriter, false)
	problems, err := w.v.Health(ctx, gone.Volume, gone.staging, "")
	if err != nil || len(problems) != 1 || problems[0].Reason != ReasonDeviceMissing || problems[0].Degraded() {
		t.Fatalf("Health of a volume with no device = %q, %v", problems, err)
	}
}

func TestCheckVolumeHealthCannotCheck(t *testing.T) {
	for _, tc := range []struct {
		name, fail string
		want       []string
	}{
		{"device cannot be looked at", "stat /dev/loop0", []string{"check device /dev/loop0", "permission denied"}},
		{"staging path cannot be looked at", "stat STAGING", []string{"check staging path", "permission denied"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newHealthWorld(t)
			w.host.Fail[strings.Replace(tc.fail, "STAGING", w.fs.staging, 1)] = unix.EACCES
			problems, err := w.v.checkHealth("/dev/loop0", w.fs.staging, "", false)
			if err == nil {
				t.Fatalf("checkHealth = %q, want an error: the check could not be made", problems)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}
