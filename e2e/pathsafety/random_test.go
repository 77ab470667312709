//go:build root

package pathsafety

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// randomSeed and randomRequests bound the randomized test; the seed is
// logged, and SPINDLE_PATHSAFETY_SEED replays a run.
const (
	defaultSeed    = 19
	randomRequests = 1000
)

// TestRandomNodeRequests sends many malformed and hostile Node requests,
// drawn with a fixed seed from the paths, IDs and capabilities a confused
// kubelet or a hand-made call could send, to a running driver with two
// staged volumes. Afterwards everything outside the driver's root, and the
// precious things inside it, must be exactly as before; no answer may be
// INTERNAL (that code is for bugs), and the driver must not have panicked.
func TestRandomNodeRequests(t *testing.T) {
	seed := uint64(defaultSeed)
	if s := os.Getenv("SPINDLE_PATHSAFETY_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SPINDLE_PATHSAFETY_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (SPINDLE_PATHSAFETY_SEED replays it)", seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x5deece66d))
	w := newWorld(t)

	precious := filepath.Join(w.root, "precious")
	if err := os.MkdirAll(precious, 0o750); err != nil {
		t.Fatal(err)
	}
	var preciousPaths []string
	for _, kind := range victimKinds {
		if kind.name == "empty file" {
			continue // an empty file is what unpublish may remove
		}
		p := filepath.Join(precious, strings.ReplaceAll(kind.name, " ", "-"))
		kind.make(t, w, p)
		preciousPaths = append(preciousPaths, p)
	}
	escapeDir := filepath.Join(w.outside, "escape-target")
	if err := os.MkdirAll(escapeDir, 0o750); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(escapeDir, "victim"), "precious\n")
	writeFile(t, filepath.Join(w.outside, "victim"), "precious\n")
	if err := os.Symlink(escapeDir, filepath.Join(w.root, "escape")); err != nil {
		t.Fatal(err)
	}
	preciousBefore, outsideBefore := fingerprint(t, precious), fingerprint(t, w.outside)

	scratch := func() string {
		return filepath.Join(w.root, "scratch", strconv.Itoa(rng.IntN(6)), []string{"mount", "globalmount", "dev", "pv"}[rng.IntN(4)])
	}
	paths := []func() string{
		scratch, scratch, scratch,
		func() string { return w.fsVol.StagingPath },
		func() string { return w.blockVol.StagingPath },
		func() string { return w.fsTarget },
		func() string { return preciousPaths[rng.IntN(len(preciousPaths))] },
		func() string { return preciousPaths[rng.IntN(len(preciousPaths))] + "/child" },
		func() string { return filepath.Join(w.outside, "victim") },
		func() string { return filepath.Join(w.root, "escape", "victim") },
		func() string { return w.root + "/scratch/../../outside/victim" },
		func() string { return w.root },
		func() string { return w.root + "/" },
		func() string { return "" },
		func() string { return "relative/path" },
		func() string { return "/" },
		func() string { return "/dev/null" },
		func() string { return "/proc/self/root" + w.outside + "/victim" },
		func() string { return w.root + "/with\x00nul" },
		func() string { return w.root + "/ctrl\x01\n\tchars" },
		func() string { return w.root + "/" + strings.Repeat("a", 300) },
		func() string { return w.root + strings.Repeat("/d", 2100) },
		func() string { return w.root + "//double" },
	}
	ids := []string{w.fsVol.ID, w.blockVol.ID, w.fsVol.ID, w.blockVol.ID, missingVolume, "", "fake-vol-id-6fbd0cfa-e",
		"loop/default/../x", "loop/nope/x", "loop/default/" + strings.Repeat("x", 200), "loop/default/a\x00b"}
	modes := []csi.VolumeCapability_AccessMode_Mode{0, 1, 2, 3, 4, 5, 6, 7, 42}
	capability := func() *csi.VolumeCapability {
		if rng.IntN(8) == 0 {
			return nil
		}
		c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: modes[rng.IntN(len(modes))]}}
		switch rng.IntN(4) {
		case 0:
			c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
		case 1:
			c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}}
		case 2:
			c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: []string{"xfs", "zfs", "", "ext4"}[rng.IntN(4)],
				MountFlags: [][]string{nil, {"ro"}, {"bind"}, {"noatime", ""}}[rng.IntN(4)]}}
		}
		if rng.IntN(2) == 0 {
			c.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
		}
		return c
	}
	// Half the paths are ones the driver may use, so valid requests mix
	// with hostile ones and the volumes really move.
	pick := func() string {
		if rng.IntN(2) == 0 {
			return paths[rng.IntN(6)]()
		}
		return paths[rng.IntN(len(paths))]()
	}

	codeCount := map[codes.Code]int{}
	used := map[string]bool{}
	for i := 0; i < randomRequests; i++ {
		id := ids[rng.IntN(len(ids))]
		if rng.IntN(2) == 0 {
			id = ids[rng.IntN(2)]
		}
		p1, p2 := pick(), pick()
		used[p1], used[p2] = true, true
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var err error
		var what string
		switch rng.IntN(9) {
		case 0:
			what = "NodeStageVolume"
			_, err = w.drv.Node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: p1, VolumeCapability: capability(), PublishContext: w.pc(id)})
		case 1:
			what = "NodeUnstageVolume"
			_, err = w.drv.Node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: p1})
		case 2, 3:
			what = "NodePublishVolume"
			_, err = w.drv.Node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: p2, TargetPath: p1,
				VolumeCapability: capability(), PublishContext: w.pc(id), Readonly: rng.IntN(3) == 0})
		case 4, 5:
			what = "NodeUnpublishVolume"
			_, err = w.drv.Node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: p1})
		case 6:
			what = "NodeGetVolumeStats"
			_, err = w.drv.Node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: p1, StagingTargetPath: p2})
		case 7:
			what = "NodeExpandVolume"
			_, err = w.drv.Node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: p1, StagingTargetPath: p2, VolumeCapability: capability()})
		case 8:
			what = "NodeGetVolumeHealth"
			_, err = w.drv.Node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: id, StagingTargetPath: p1, VolumePublishPath: p2})
		}
		cancel()
		code := codeOf(err)
		codeCount[code]++
		if code == codes.Internal || code == codes.Unknown {
			t.Errorf("request %d: %s(%q, %q, %q) = %v; INTERNAL is for bugs", i, what, id, p1, p2, err)
		}
	}
	t.Logf("%d requests: %v", randomRequests, codeCount)

	// Inside the root, valid requests may add what the driver makes (a
	// mount point, an empty block target, a stage record); everything
	// that was there must still be there, exactly as it was.
	after := fingerprint(t, precious)
	for _, line := range strings.Split(preciousBefore, "\n") {
		if !strings.Contains(after, line+"\n") {
			t.Errorf("changed or gone inside the root: %s\nnow:\n%s", line, after)
		}
	}
	if got := fingerprint(t, w.outside); got != outsideBefore {
		t.Errorf("something outside the driver's root changed:\nbefore:\n%s\nafter:\n%s", outsideBefore, got)
	}
	if _, err := w.drv.Node.NodeGetCapabilities(context.Background(), &csi.NodeGetCapabilitiesRequest{}); err != nil {
		t.Errorf("the driver no longer answers: %v", err)
	}

	// Take back whatever the valid requests among them published or
	// staged, so the world's own clean-up and the leak check find the
	// node as it began.
	for round := 0; round < 2; round++ {
		for p := range used {
			for _, id := range []string{w.fsVol.ID, w.blockVol.ID} {
				_, _ = w.drv.Node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: p})
			}
		}
		for p := range used {
			if p == w.fsVol.StagingPath || p == w.blockVol.StagingPath {
				continue
			}
			for _, id := range []string{w.fsVol.ID, w.blockVol.ID} {
				_, _ = w.drv.Node.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: p})
			}
		}
	}
}
