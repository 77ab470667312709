package blockdev

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

func scripted(t *testing.T, steps ...*commandtest.Step) *losetup {
	return newLosetup(command.New(commandtest.New(t, steps...), nil))
}

func TestLosetupAttach(t *testing.T) {
	tests := []struct {
		name     string
		readOnly bool
		buffered bool // the image's directIO mutable parameter is "false"
		step     *commandtest.Step
		want     string
		kind     error // with wantErr
		wantErr  string
	}{
		{
			name: "read-write",
			step: commandtest.Expect("losetup", "--find", "--show", "--direct-io=on", "--sector-size", "4096", "/pool/a.img").Prints("/dev/loop3\n"),
			want: "/dev/loop3",
		},
		{
			name:     "read-only",
			readOnly: true,
			step:     commandtest.Expect("losetup", "--find", "--show", "--direct-io=on", "--sector-size", "4096", "--read-only", "/pool/a.img").Prints("/dev/loop7\n"),
			want:     "/dev/loop7",
		},
		{
			name:     "direct I/O off",
			buffered: true,
			step:     commandtest.Expect("losetup", "--find", "--show", "--direct-io=off", "--sector-size", "4096", "/pool/a.img").Prints("/dev/loop4\n"),
			want:     "/dev/loop4",
		},
		{
			name:     "direct I/O off, read-only",
			readOnly: true,
			buffered: true,
			step:     commandtest.Expect("losetup", "--find", "--show", "--direct-io=off", "--sector-size", "4096", "--read-only", "/pool/a.img").Prints("/dev/loop5\n"),
			want:     "/dev/loop5",
		},
		{
			name:    "no free device",
			step:    commandtest.Expect("losetup", "--find", "--show", "--direct-io=on", "--sector-size", "4096", "/pool/a.img").Exits(1, "losetup: cannot find an unused loop device: could not find any free loop device"),
			kind:    errdefs.ErrExhausted,
			wantErr: "no free loop device",
		},
		{
			name:    "other failure keeps stderr",
			step:    commandtest.Expect("losetup", "--find", "--show", "--direct-io=on", "--sector-size", "4096", "/pool/a.img").Exits(1, "losetup: /pool/a.img: failed to set up loop device: Permission denied"),
			wantErr: "Permission denied",
		},
		{
			// Never hand on something that is not a loop device path.
			name:    "unexpected output",
			step:    commandtest.Expect("losetup", "--find", "--show", "--direct-io=on", "--sector-size", "4096", "/pool/a.img").Prints("/dev/sda\n"),
			wantErr: "not a loop device",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := scripted(t, tt.step)
			dev, err := l.Attach(t.Context(), "/pool/a.img", tt.readOnly, !tt.buffered)
			if tt.wantErr == "" {
				if err != nil || dev != tt.want {
					t.Fatalf("Attach = %q, %v; want %q", dev, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Attach = %q, %v; want an error naming %q", dev, err, tt.wantErr)
			}
			if errdefs.KindOf(err) != tt.kind {
				t.Fatalf("error kind = %v, want %v", errdefs.KindOf(err), tt.kind)
			}
		})
	}
}

// While another attach of this process looks for a free device, an
// attach waits for it instead of racing it for the same device, and gives
// up when its context ends, without running losetup.
func TestLosetupAttachWaitsForAnotherFind(t *testing.T) {
	findSlot <- struct{}{} // another attach is looking for a device
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := scripted(t).Attach(ctx, "/pool/a.img", false, true)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Attach while another find runs = %v, want it to wait until its deadline", err)
	}
	<-findSlot // the other attach is done
	l := scripted(t, commandtest.Expect("losetup", "--find", "--show", "--direct-io=on", "--sector-size", "4096", "/pool/a.img").Prints("/dev/loop3\n"))
	if dev, err := l.Attach(t.Context(), "/pool/a.img", false, true); err != nil || dev != "/dev/loop3" {
		t.Fatalf("Attach after the other find = %q, %v", dev, err)
	}
}

func TestLosetupDetach(t *testing.T) {
	t.Run("detaches", func(t *testing.T) {
		l := scripted(t, commandtest.Expect("losetup", "--detach", "/dev/loop3"))
		if err := l.Detach(t.Context(), "/dev/loop3"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("already gone", func(t *testing.T) {
		l := scripted(t, commandtest.Expect("losetup", "--detach", "/dev/loop3").Exits(1, "losetup: /dev/loop3: detach failed: No such device or address"))
		if err := l.Detach(t.Context(), "/dev/loop3"); err != nil {
			t.Fatalf("Detach of a device that is gone: %v", err)
		}
	})
	t.Run("other failure", func(t *testing.T) {
		l := scripted(t, commandtest.Expect("losetup", "--detach", "/dev/loop3").Exits(1, "losetup: /dev/loop3: detach failed: Permission denied"))
		if err := l.Detach(t.Context(), "/dev/loop3"); err == nil || !strings.Contains(err.Error(), "Permission denied") {
			t.Fatalf("Detach = %v, want the failure with its stderr", err)
		}
	})
}

// TestLosetupList reads a sysfs tree laid out like the kernel's.
func TestLosetupBoundToAndGet(t *testing.T) {
	sys := t.TempDir()
	write := func(rel, content string) {
		p := filepath.Join(sys, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("block/loop0/loop/backing_file", "/pool/a.img\n")
	write("block/loop0/ro", "0\n")
	write("block/loop1/loop/backing_file", "/pool/with space.img (deleted)\n")
	write("block/loop1/ro", "1\n")
	write("block/loop1/loop/autoclear", "1\n")
	write("block/loop2/ro", "0\n") // not bound: no loop/ directory
	write("block/sda/ro", "0\n")   // not a loop device

	write("block/loop0/loop/autoclear", "0\n")
	write("block/loop3/loop/backing_file", "/pool/a.img\n") // a second device of a.img
	write("block/loop3/ro", "1\n")
	write("block/loop3/loop/autoclear", "0\n")

	l := &losetup{sysRoot: sys, devRoot: "/dev"}
	tests := []struct {
		file string
		want []LoopDevice
	}{
		{"/pool/a.img", []LoopDevice{
			{Path: "/dev/loop0", BackingFile: "/pool/a.img"},
			{Path: "/dev/loop3", BackingFile: "/pool/a.img", ReadOnly: true},
		}},
		// The kernel's " (deleted)" suffix is not part of the name.
		{"/pool/with space.img", []LoopDevice{
			{Path: "/dev/loop1", BackingFile: "/pool/with space.img", Deleted: true, ReadOnly: true, AutoClear: true},
		}},
		{"/pool/other.img", nil},
	}
	for _, tc := range tests {
		got, err := l.BoundTo(t.Context(), tc.file)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("BoundTo(%s) = %+v\nwant %+v", tc.file, got, tc.want)
		}
	}

	d, err := l.Get(t.Context(), "/dev/loop1")
	if err != nil || d.BackingFile != "/pool/with space.img" || !d.Deleted || !d.ReadOnly || !d.AutoClear {
		t.Errorf("Get(/dev/loop1) = %+v, %v", d, err)
	}
	for dev, kind := range map[string]error{"/dev/loop2": errdefs.ErrNotFound, "/dev/sda": errdefs.ErrInvalidArgument, "/tmp/loop0": errdefs.ErrInvalidArgument} {
		if _, err := l.Get(t.Context(), dev); errdefs.KindOf(err) != kind {
			t.Errorf("Get(%s) = %v, want kind %v", dev, err, kind)
		}
	}
}

// BoundTo answers from an index of the node's bound devices: a device
// rebound or detached since is never reported, one this process attaches is
// seen at once, and one bound by another process is seen once the index is
// rebuilt, bindingsMaxAge later.
func TestLosetupBoundToIndex(t *testing.T) {
	sys := t.TempDir()
	write := func(rel, content string) {
		p := filepath.Join(sys, "block", rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bind := func(name, file string) {
		write(name+"/loop/backing_file", file+"\n")
		write(name+"/ro", "0\n")
		write(name+"/loop/autoclear", "0\n")
	}
	unbind := func(name string) {
		if err := os.RemoveAll(filepath.Join(sys, "block", name, "loop")); err != nil {
			t.Fatal(err)
		}
	}
	clock := time.Unix(1_800_000_000, 0)
	script := commandtest.New(t, commandtest.Expect("losetup", "--find", "--show", "--direct-io=on", "--sector-size", "4096", "/pool/c.img").Prints("/dev/loop2\n"))
	l := &losetup{run: command.New(script, nil), sysRoot: sys, devRoot: "/dev", now: func() time.Time { return clock }}
	boundTo := func(file string) []string {
		t.Helper()
		devs, err := l.BoundTo(t.Context(), file)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, d := range devs {
			out = append(out, d.Path)
		}
		return out
	}
	bind("loop0", "/pool/a.img")
	bind("loop1", "/pool/b.img")
	if got := boundTo("/pool/a.img"); !slices.Equal(got, []string{"/dev/loop0"}) {
		t.Fatalf("BoundTo(a) = %v", got)
	}
	// loop0 rebound to b, loop1 detached: read back, never reported stale.
	bind("loop0", "/pool/b.img")
	unbind("loop1")
	if got := boundTo("/pool/a.img"); got != nil {
		t.Errorf("BoundTo(a) after a rebind = %v, want none", got)
	}
	if got := boundTo("/pool/b.img"); got != nil {
		t.Errorf("BoundTo(b) before the index is rebuilt = %v, want none (loop1 is gone, loop0 unknown yet)", got)
	}
	// This process's attach is known at once.
	if _, err := l.Attach(t.Context(), "/pool/c.img", false, true); err != nil {
		t.Fatal(err)
	}
	bind("loop2", "/pool/c.img")
	if got := boundTo("/pool/c.img"); !slices.Equal(got, []string{"/dev/loop2"}) {
		t.Errorf("BoundTo(c) after Attach = %v", got)
	}
	// Another process's bind is found by the next full scan.
	clock = clock.Add(bindingsMaxAge + time.Second)
	if got := boundTo("/pool/b.img"); !slices.Equal(got, []string{"/dev/loop0"}) {
		t.Errorf("BoundTo(b) after the rebuild = %v, want loop0", got)
	}
}

func TestLosetupAvailable(t *testing.T) {
	dev := t.TempDir()
	l := &losetup{devRoot: dev}
	err := l.Available()
	if errdefs.KindOf(err) != errdefs.ErrUnavailable || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Available without loop-control = %v, want unavailable", err)
	}
	if err := os.WriteFile(filepath.Join(dev, "loop-control"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := l.Available(); err != nil {
		t.Fatalf("Available with loop-control: %v", err)
	}
}

func TestLosetupInUseOfMissingDevice(t *testing.T) {
	busy, err := newLosetup(nil).InUse(filepath.Join(t.TempDir(), "loop99"))
	if err != nil || busy {
		t.Fatalf("InUse of a device that does not exist = %t, %v; want free", busy, err)
	}
}

func TestLosetupSetCapacity(t *testing.T) {
	tests := []struct {
		name    string
		step    *commandtest.Step
		kind    error
		wantErr string
	}{
		{name: "refreshes", step: commandtest.Expect("losetup", "--set-capacity", "/dev/loop3")},
		{
			name:    "device gone",
			step:    commandtest.Expect("losetup", "--set-capacity", "/dev/loop3").Exits(1, "losetup: /dev/loop3: set capacity failed: No such device or address"),
			kind:    errdefs.ErrNotFound,
			wantErr: "not bound",
		},
		{
			name:    "other failure keeps stderr",
			step:    commandtest.Expect("losetup", "--set-capacity", "/dev/loop3").Exits(1, "losetup: /dev/loop3: set capacity failed: Permission denied"),
			wantErr: "Permission denied",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := scripted(t, tt.step).SetCapacity(t.Context(), "/dev/loop3")
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || errdefs.KindOf(err) != tt.kind {
				t.Fatalf("SetCapacity = %v (kind %v); want kind %v naming %q", err, errdefs.KindOf(err), tt.kind, tt.wantErr)
			}
		})
	}
	t.Run("not a loop device: no command", func(t *testing.T) {
		err := scripted(t).SetCapacity(t.Context(), "/dev/sda")
		if errdefs.KindOf(err) != errdefs.ErrInvalidArgument {
			t.Fatalf("SetCapacity(/dev/sda) = %v, want invalid argument", err)
		}
	})
}

// TestLosetupSize reads /sys/block/loopN/size, which counts 512-byte sectors.
func TestLosetupSize(t *testing.T) {
	sys := t.TempDir()
	if err := os.MkdirAll(filepath.Join(sys, "block", "loop3"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sys, "block", "loop3", "size"), []byte("24576\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(sys, "block", "loop4"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sys, "block", "loop4", "size"), []byte("lots\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l := &losetup{sysRoot: sys, devRoot: "/dev"}
	if size, err := l.Size("/dev/loop3"); err != nil || size != 12<<20 {
		t.Fatalf("Size(/dev/loop3) = %d, %v; want %d", size, err, 12<<20)
	}
	for dev, kind := range map[string]error{"/dev/loop9": errdefs.ErrNotFound, "/dev/sda": errdefs.ErrInvalidArgument, "/dev/loop4": nil} {
		_, err := l.Size(dev)
		if err == nil || errdefs.KindOf(err) != kind {
			t.Errorf("Size(%s) = %v, want an error of kind %v", dev, err, kind)
		}
	}
}
