package driver

import (
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/spindle-csi/spindle/internal/controller"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

func TestCreateVolumeValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(*csi.CreateVolumeRequest)
		code   codes.Code
		want   []string // substrings of the message; the first names the field
	}{
		{"missing name", func(r *csi.CreateVolumeRequest) { r.Name = "" }, codes.InvalidArgument, []string{"name is required"}},
		{"name too long", func(r *csi.CreateVolumeRequest) { r.Name = strings.Repeat("a", 129) }, codes.InvalidArgument, []string{"name is 129 bytes", "maximum is 128"}},
		{"name with newline", func(r *csi.CreateVolumeRequest) { r.Name = "pvc\n1" }, codes.InvalidArgument, []string{"name", "control character"}},
		{"name with NUL", func(r *csi.CreateVolumeRequest) { r.Name = "pvc\x001" }, codes.InvalidArgument, []string{"name", "control character"}},
		{"name with DEL", func(r *csi.CreateVolumeRequest) { r.Name = "pvc\x7f" }, codes.InvalidArgument, []string{"name", "control character"}},
		{"no capabilities", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities = nil }, codes.InvalidArgument, []string{"volume_capabilities is required"}},
		{"nil capability", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities = []*csi.VolumeCapability{nil} }, codes.InvalidArgument, []string{"volume_capabilities[0] is required"}},
		{"unknown access mode", func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities[0].AccessMode.Mode = csi.VolumeCapability_AccessMode_UNKNOWN
		}, codes.InvalidArgument, []string{"volume_capabilities[0].access_mode is required"}},
		{"no access mode", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities[0].AccessMode = nil }, codes.InvalidArgument, []string{"volume_capabilities[0].access_mode is required"}},
		{"access mode out of the enum", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities[0].AccessMode.Mode = 42 }, codes.InvalidArgument, []string{"volume_capabilities[0].access_mode 42"}},
		{"no access type", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities[0].AccessType = nil }, codes.InvalidArgument, []string{"volume_capabilities[0].access_type"}},
		{"mixed block and mount", func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = append(r.VolumeCapabilities, blockCap(snw))
		}, codes.InvalidArgument, []string{"volume_capabilities mixes mount and block"}},
		{"two fs types", func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = append(r.VolumeCapabilities, mountCap("xfs", snw))
		}, codes.InvalidArgument, []string{"volume_capabilities asks for fs types", "ext4", "xfs"}},
		{"fs type and default fs type", func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = append(r.VolumeCapabilities, mountCap("", snw))
		}, codes.InvalidArgument, []string{"volume_capabilities asks for fs types"}},
		{"unknown fs type", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities[0] = mountCap("zfs", snw) }, codes.InvalidArgument, []string{"volume_capabilities[0].mount.fs_type", "zfs"}},
		{"unknown fs type in second capability", func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = append(r.VolumeCapabilities, mountCap("ntfs", snw))
		}, codes.InvalidArgument, []string{"volume_capabilities[1].mount.fs_type"}},
		{"multi-node multi-writer mount", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities[0] = mountCap("ext4", mnmw) }, codes.InvalidArgument, []string{"volume_capabilities[0]", "MULTI_NODE_MULTI_WRITER", "cluster filesystem"}},
		{"multi-node single-writer mount", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities[0] = mountCap("ext4", mnsw) }, codes.InvalidArgument, []string{"volume_capabilities[0]", "MULTI_NODE_SINGLE_WRITER", "cluster filesystem"}},
		{"multi-node multi-writer block on loop", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities[0] = blockCap(mnmw) }, codes.InvalidArgument, []string{"volume_capabilities[0]", "loop backend"}},
		{"bind mount flag", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities[0] = mountCap("ext4", snw, "bind") }, codes.InvalidArgument, []string{"volume_capabilities[0].mount.mount_flags", `"bind" is not allowed`}},
		{"mount flag with a space", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities[0] = mountCap("ext4", snw, "noatime nodev") }, codes.InvalidArgument, []string{"volume_capabilities[0].mount.mount_flags"}},
		{"empty mount flag", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities[0] = mountCap("ext4", snw, "") }, codes.InvalidArgument, []string{"volume_capabilities[0].mount.mount_flags"}},
		{"unknown parameter", func(r *csi.CreateVolumeRequest) { r.Parameters = map[string]string{"fsType": "ext4"} }, codes.InvalidArgument, []string{"parameters: unknown key", `"fsType"`}},
		{"mkfsOptions naming a device", func(r *csi.CreateVolumeRequest) { r.Parameters = map[string]string{"mkfsOptions": "-L data /dev/sda"} }, codes.InvalidArgument, []string{"parameters.mkfsOptions", "/dev/sda"}},
		{"mkfsOptions with a control character", func(r *csi.CreateVolumeRequest) { r.Parameters = map[string]string{"mkfsOptions": "-L\x01x"} }, codes.InvalidArgument, []string{"parameters.mkfsOptions", "control character"}},
		{"backend not configured", func(r *csi.CreateVolumeRequest) { r.Parameters = map[string]string{"backend": "loop/nope"} }, codes.InvalidArgument, []string{"parameters.backend", "loop/nope", defaultKey, fastKey}},
		{"backend malformed", func(r *csi.CreateVolumeRequest) { r.Parameters = map[string]string{"backend": "../../etc"} }, codes.InvalidArgument, []string{"parameters.backend"}},
		{"negative required", func(r *csi.CreateVolumeRequest) { r.CapacityRange = &csi.CapacityRange{RequiredBytes: -1} }, codes.InvalidArgument, []string{"capacity_range", "negative"}},
		{"negative limit", func(r *csi.CreateVolumeRequest) { r.CapacityRange = &csi.CapacityRange{LimitBytes: -1} }, codes.InvalidArgument, []string{"capacity_range", "negative"}},
		{"required above limit", func(r *csi.CreateVolumeRequest) {
			r.CapacityRange = &csi.CapacityRange{RequiredBytes: 20 * mib, LimitBytes: 10 * mib}
		}, codes.InvalidArgument, []string{"capacity_range.required_bytes", "exceeds limit_bytes"}},
		{"content source in another backend instance", func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "loop/fast/x"}}}
		}, codes.InvalidArgument, []string{"volume_content_source.volume.volume_id", "loop/fast", "loop/default"}},
		{"content source that does not exist", func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "loop/default/snap-x"}}}
		}, codes.NotFound, []string{"snap-x"}},
		{"content source that is no Spindle ID", func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "not-an-id"}}}
		}, codes.NotFound, []string{"volume_content_source.volume.volume_id", "not-an-id"}},
		{"content source without an ID", func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{}}}
		}, codes.InvalidArgument, []string{"volume_content_source.volume.volume_id is required"}},
		{"limit below the xfs minimum", func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities[0] = mountCap("xfs", snw)
			r.CapacityRange = &csi.CapacityRange{RequiredBytes: 10 * mib, LimitBytes: 100 * mib}
		}, codes.OutOfRange, []string{"capacity_range"}},
		{"larger than the largest volume", func(r *csi.CreateVolumeRequest) {
			r.CapacityRange = &csi.CapacityRange{RequiredBytes: controller.MaxCapacity + 1}
		}, codes.OutOfRange, []string{"largest volume"}},
	}
	e := newTestEnv(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := createReq("pvc-validation")
			tt.mutate(req)
			resp, err := e.CreateVolume(req)
			wantCode(t, err, tt.code, tt.want...)
			if resp != nil {
				t.Fatalf("response %v returned with an error", resp)
			}
		})
	}
	// Nothing was allocated by any refused request.
	for _, key := range []string{defaultKey, fastKey} {
		if imgs := e.poolImages(t, key); len(imgs) != 0 {
			t.Fatalf("refused requests left images in %s: %v", key, imgs)
		}
	}
}

// Every RPC that takes a volume ID refuses a missing one (INVALID_ARGUMENT,
// naming the field), and finds no volume behind one that Spindle could
// never have issued (NOT_FOUND, saying why), before touching any backend:
// such an ID is never used as a path or an argument.
func TestVolumeIDValidation(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.registerNodes(t, defaultKey, testNodeID)
	stage, target := e.kubelet+"/plugins/staging/x", e.kubelet+"/pods/p/volumes/x/mount"
	rpcs := []volumeRPC{
		{"ControllerPublishVolume", func(id string) error {
			_, err := e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: testNodeID, VolumeCapability: mountCap("ext4", snw)})
			return err
		}},
		{"ValidateVolumeCapabilities", func(id string) error {
			_, err := e.ValidateVolumeCapabilities(&csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{mountCap("ext4", snw)}})
			return err
		}},
		{"ControllerGetVolume", func(id string) error {
			_, err := call(e, "/csi.v1.Controller/ControllerGetVolume", e.cs.ControllerGetVolume, &csi.ControllerGetVolumeRequest{VolumeId: id})
			return err
		}},
		{"ControllerExpandVolume", func(id string) error {
			_, err := call(e, "/csi.v1.Controller/ControllerExpandVolume", e.cs.ControllerExpandVolume, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: gib}})
			return err
		}},
		{"ControllerModifyVolume", func(id string) error {
			_, err := call(e, "/csi.v1.Controller/ControllerModifyVolume", e.cs.ControllerModifyVolume, &csi.ControllerModifyVolumeRequest{VolumeId: id})
			return err
		}},
		{"ControllerGetVolumeHealth", func(id string) error {
			_, err := call(e, "/csi.v1.Controller/ControllerGetVolumeHealth", e.cs.ControllerGetVolumeHealth, &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
			return err
		}},
		{"NodeGetVolumeStats", func(id string) error {
			_, err := e.NodeGetVolumeStats(&csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
			return err
		}},
		{"NodeExpandVolume", func(id string) error {
			_, err := call(e, "/csi.v1.Node/NodeExpandVolume", e.ns.NodeExpandVolume, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target})
			return err
		}},
		{"NodeGetVolumeHealth", func(id string) error {
			_, err := call(e, "/csi.v1.Node/NodeGetVolumeHealth", e.ns.NodeGetVolumeHealth, &csi.NodeGetVolumeHealthRequest{VolumeId: id, StagingTargetPath: stage})
			return err
		}},
	}
	rpcs = append(rpcs, e.nodeRPCs(stage, target)...)
	ids := []struct {
		name, id string
		want     []string
	}{
		{"not an ID", "fake-vol-id-6fbd0cfa-e", []string{"volume_id", "names no Spindle volume", "not of the form"}},
		{"two parts", "loop/default", []string{"volume_id", "not of the form"}},
		{"dot-dot", "loop/default/../../etc/passwd", []string{"volume_id", `".."`}},
		{"too long", "loop/default/" + strings.Repeat("a", 116), []string{"volume_id", "maximum is 128"}},
		{"empty segment", "rbd/ceph/kube//img", []string{"volume_id", "empty segment"}},
		{"empty image", "loop/default/", []string{"volume_id", "image name is empty"}},
		{"upper-case backend", "LOOP/default/a", []string{"volume_id", "backend"}},
		{"space", "loop/default/a b", []string{"volume_id", "characters outside"}},
		{"control character", "loop/default/a\nb", []string{"volume_id", `\n`}},
	}
	for _, rpc := range rpcs {
		t.Run(rpc.name+"/empty", func(t *testing.T) {
			wantCode(t, rpc.call(""), codes.InvalidArgument, "volume_id is required")
		})
		for _, id := range ids {
			t.Run(rpc.name+"/"+id.name, func(t *testing.T) {
				wantCode(t, rpc.call(id.id), codes.NotFound, id.want...)
			})
		}
	}
	// ControllerUnpublishVolume: no node can hold a volume that cannot
	// exist, so it is unpublished, as the spec asks.
	wantCode(t, e.ControllerUnpublish("", testNodeID), codes.InvalidArgument, "volume_id is required")
	for _, id := range ids {
		wantCode(t, e.ControllerUnpublish(id.id, testNodeID), codes.OK)
	}
	if calls := e.loops[defaultKey].Calls; len(calls) != 0 {
		t.Fatalf("malformed IDs reached the loop driver: %v", calls)
	}
}

// A missing field is reported before the ID is looked up, so a request
// that lacks one is INVALID_ARGUMENT whatever its volume ID names (as
// csi-sanity sends them, with IDs of its own making).
func TestRequiredFieldsBeforeLookup(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	const foreign = "fake-vol-id-6fbd0cfa-e"
	stage := e.kubelet + "/plugins/staging/x"
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"ControllerPublishVolume without node_id", func() error {
			_, err := e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: foreign, VolumeCapability: mountCap("ext4", snw)})
			return err
		}, "node_id is required"},
		{"ControllerPublishVolume without volume_capability", func() error {
			_, err := e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: foreign, NodeId: testNodeID})
			return err
		}, "volume_capability is required"},
		{"ValidateVolumeCapabilities without capabilities", func() error {
			_, err := e.ValidateVolumeCapabilities(&csi.ValidateVolumeCapabilitiesRequest{VolumeId: foreign})
			return err
		}, "volume_capabilities is required"},
		{"NodeStageVolume without volume_capability", func() error {
			return e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: foreign, StagingTargetPath: stage})
		}, "volume_capability is required"},
		{"NodeStageVolume without staging_target_path", func() error {
			return e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: foreign, VolumeCapability: mountCap("ext4", snw)})
		}, "staging_target_path is required"},
		{"NodePublishVolume without target_path", func() error {
			return e.NodePublish(&csi.NodePublishVolumeRequest{VolumeId: foreign, StagingTargetPath: stage, VolumeCapability: mountCap("ext4", snw)})
		}, "target_path is required"},
		{"NodeUnpublishVolume without target_path", func() error {
			return e.NodeUnpublish(&csi.NodeUnpublishVolumeRequest{VolumeId: foreign})
		}, "target_path is required"},
		{"NodeGetVolumeStats without volume_path", func() error {
			_, err := e.NodeGetVolumeStats(&csi.NodeGetVolumeStatsRequest{VolumeId: foreign})
			return err
		}, "volume_path is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantCode(t, tt.call(), codes.InvalidArgument, tt.want)
		})
	}
}

// ControllerModifyVolume with no mutable parameters changes nothing and
// succeeds, for a volume that exists.
func TestModifyVolumeWithNothingToChange(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	vol := e.mustCreate(t, createReq("pvc-modify-nothing"))
	before := e.image(t, vol)
	_, err := call(e, "/csi.v1.Controller/ControllerModifyVolume", e.cs.ControllerModifyVolume, &csi.ControllerModifyVolumeRequest{VolumeId: vol})
	wantCode(t, err, codes.OK)
	if after := e.image(t, vol); !maps.Equal(after.MutableParameters, before.MutableParameters) {
		t.Errorf("mutable parameters changed: %v -> %v", before.MutableParameters, after.MutableParameters)
	}
	_, err = call(e, "/csi.v1.Controller/ControllerModifyVolume", e.cs.ControllerModifyVolume, &csi.ControllerModifyVolumeRequest{VolumeId: "loop/default/pvc-gone"})
	wantCode(t, err, codes.NotFound)
}

// DeleteVolume needs an ID, but an ID that no Spindle volume can have names
// nothing to delete: success, as the spec asks for a missing volume.
func TestDeleteVolumeIDs(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	keep := e.mustCreate(t, createReq("pvc-keep"))
	tests := []struct {
		id   string
		code codes.Code
		want []string
	}{
		{"", codes.InvalidArgument, []string{"volume_id is required"}},
		{"fake-vol-id", codes.OK, nil},
		{"loop/default/../../etc/passwd", codes.OK, nil},
		{"loop/default/a//b", codes.OK, nil},
		{"loop/default/" + strings.Repeat("a", 200), codes.OK, nil},
		{"loop/default/pvc-never-created", codes.OK, nil},
		// Ours, but served by nothing here: "deleted" would lose an image.
		{"loop/other/pvc-keep", codes.FailedPrecondition, []string{"loop/other", "not configured", defaultKey}},
		{"rbd/ceph-a/kube/csi-vol-1", codes.FailedPrecondition, []string{"rbd/ceph-a", "not configured"}},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			wantCode(t, e.DeleteVolume(tt.id), tt.code, tt.want...)
		})
	}
	if img := e.image(t, keep); img.Name != "pvc-keep" {
		t.Fatalf("unrelated volume changed: %+v", img)
	}
}

func TestNodeIDValidation(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	vol := e.mustCreate(t, createReq("pvc-nodeid"))
	bad := []struct {
		name, nodeID string
		want         string
	}{
		{"slash", "node/a", "node_id"},
		{"leading dash", "-node", "node_id"},
		{"dot", ".", "node_id"},
		{"dot-dot", "..", "node_id"},
		{"space", "node a", "node_id"},
		{"too long", strings.Repeat("n", 129), "node_id"},
		{"NUL", "node\x00a", "node_id"},
	}
	for _, tt := range bad {
		t.Run("publish/"+tt.name, func(t *testing.T) {
			_, err := e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: tt.nodeID, VolumeCapability: mountCap("ext4", snw)})
			wantCode(t, err, codes.InvalidArgument, tt.want)
		})
		t.Run("unpublish/"+tt.name, func(t *testing.T) {
			wantCode(t, e.ControllerUnpublish(vol, tt.nodeID), codes.InvalidArgument, tt.want)
		})
	}
	t.Run("publish/empty", func(t *testing.T) {
		_, err := e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: vol, VolumeCapability: mountCap("ext4", snw)})
		wantCode(t, err, codes.InvalidArgument, "node_id is required")
	})
	// ControllerUnpublishVolume without a node means "every node".
	t.Run("unpublish/empty", func(t *testing.T) {
		wantCode(t, e.ControllerUnpublish(vol, ""), codes.OK)
	})
	t.Run("longest", func(t *testing.T) {
		// 128 characters is a valid ID; it is unknown to the backend.
		_, err := e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: strings.Repeat("n", 128), VolumeCapability: mountCap("ext4", snw)})
		wantCode(t, err, codes.NotFound, "has not registered")
	})
}

func TestValidatePath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		path string
		want string // "" = accepted
	}{
		{"/var/lib/kubelet/x", ""},
		{"/var/lib/kubelet/x/", ""}, // a trailing slash is harmless
		{"/", ""},
		{"", "is required"},
		{"relative/path", "must be an absolute path"},
		{"./x", "must be an absolute path"},
		{"/a/../b", "must be a clean path"},
		{"/a/./b", "must be a clean path"},
		{"/a//b", "must be a clean path"},
		{"/a/b/..", "must be a clean path"},
		{"/a/b//", "must be a clean path"},
		{"/a/b\x00c", "contains a NUL byte"},
		{"/" + strings.Repeat("a", maxPathLength), "longer than 4096 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			err := validatePath("target_path", tt.path)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("validatePath(%q): %v", tt.path, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("validatePath(%q) accepted", tt.path)
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("kind = %v, want invalid argument", errdefs.KindOf(err))
			}
			if !strings.HasPrefix(err.Error(), "target_path") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q: want it to start with the field and contain %q", err, tt.want)
			}
		})
	}
}

// Each node RPC validates every path it takes, naming the field.
func TestNodePathValidation(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	const vol = "loop/default/pvc-paths"
	good := e.kubelet + "/plugins/spindle/staging/pvc-paths"
	goodTarget := e.kubelet + "/pods/p/volumes/pvc-paths/mount"
	bad := []struct{ name, path, want string }{
		{"empty", "", "is required"},
		{"relative", "var/lib/x", "must be an absolute path"},
		{"unclean", "/var/lib/../x", "must be a clean path"},
		{"double slash", "/var//lib", "must be a clean path"},
		{"NUL", "/var/lib/x\x00y", "contains a NUL byte"},
	}
	rpcs := []struct {
		rpc, field string
		call       func(p string) error
	}{
		{"NodeStageVolume", "staging_target_path", func(p string) error {
			return e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: p, VolumeCapability: mountCap("ext4", snw)})
		}},
		{"NodeUnstageVolume", "staging_target_path", func(p string) error {
			return e.NodeUnstage(&csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: p})
		}},
		{"NodePublishVolume", "target_path", func(p string) error {
			return e.NodePublish(&csi.NodePublishVolumeRequest{VolumeId: vol, StagingTargetPath: good, TargetPath: p, VolumeCapability: mountCap("ext4", snw)})
		}},
		{"NodePublishVolume", "staging_target_path", func(p string) error {
			return e.NodePublish(&csi.NodePublishVolumeRequest{VolumeId: vol, StagingTargetPath: p, TargetPath: goodTarget, VolumeCapability: mountCap("ext4", snw)})
		}},
		{"NodeUnpublishVolume", "target_path", func(p string) error {
			return e.NodeUnpublish(&csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: p})
		}},
	}
	for _, rpc := range rpcs {
		for _, tt := range bad {
			t.Run(rpc.rpc+"/"+rpc.field+"/"+tt.name, func(t *testing.T) {
				wantCode(t, rpc.call(tt.path), codes.InvalidArgument, rpc.field, tt.want)
			})
		}
	}
	t.Run("NodeGetVolumeStats/empty", func(t *testing.T) {
		_, err := e.NodeGetVolumeStats(&csi.NodeGetVolumeStatsRequest{VolumeId: vol})
		wantCode(t, err, codes.InvalidArgument, "volume_path is required")
	})
}

// A capability that is missing or has no access mode is refused by every RPC
// that takes one, naming the field.
func TestCapabilityValidation(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	vol := e.mustCreate(t, createReq("pvc-caps"))
	e.registerNodes(t, defaultKey, testNodeID)
	stage := e.kubelet + "/plugins/spindle/staging/pvc-caps"
	target := e.kubelet + "/pods/p/volumes/pvc-caps/mount"
	caps := []struct {
		name string
		cap  *csi.VolumeCapability
		want string
	}{
		{"missing", nil, "volume_capability is required"},
		{"unknown access mode", mountCap("ext4", csi.VolumeCapability_AccessMode_UNKNOWN), "volume_capability.access_mode is required"},
		{"no access mode", &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}, "volume_capability.access_mode is required"},
		{"no access type", &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: snw}}, "volume_capability.access_type"},
		{"unknown fs type", mountCap("zfs", snw), "volume_capability.mount.fs_type"},
		{"multi-node writer mount", mountCap("ext4", mnmw), "volume_capability: access mode MULTI_NODE_MULTI_WRITER"},
	}
	rpcs := []struct {
		name string
		call func(c *csi.VolumeCapability) error
	}{
		{"ControllerPublishVolume", func(c *csi.VolumeCapability) error {
			_, err := e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: testNodeID, VolumeCapability: c})
			return err
		}},
		{"NodeStageVolume", func(c *csi.VolumeCapability) error {
			return e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: stage, VolumeCapability: c})
		}},
		{"NodePublishVolume", func(c *csi.VolumeCapability) error {
			return e.NodePublish(&csi.NodePublishVolumeRequest{VolumeId: vol, StagingTargetPath: stage, TargetPath: target, VolumeCapability: c})
		}},
	}
	for _, rpc := range rpcs {
		for _, tt := range caps {
			t.Run(rpc.name+"/"+tt.name, func(t *testing.T) {
				wantCode(t, rpc.call(tt.cap), codes.InvalidArgument, tt.want)
			})
		}
	}
	if img := e.image(t, vol); len(img.Attachments) != 0 {
		t.Fatalf("a refused publish left attachments: %+v", img.Attachments)
	}
	if calls := e.loops[defaultKey].Calls; len(calls) != 0 {
		t.Fatalf("refused requests reached the loop driver: %v", calls)
	}
}

// NodeStageVolume checks what the controller and the provisioner handed it.
func TestNodeStageContextValidation(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	tests := []struct {
		name string
		req  *csi.NodeStageVolumeRequest
		want []string
	}{
		{"readOnly not a boolean", &csi.NodeStageVolumeRequest{PublishContext: map[string]string{"readOnly": "maybe"}}, []string{"publish_context.readOnly", `"maybe"`}},
		{"mkfsOptions naming a device", &csi.NodeStageVolumeRequest{VolumeContext: map[string]string{"mkfsOptions": "-L x /dev/sdb"}}, []string{"volume_context", "/dev/sdb"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.VolumeId = "loop/default/pvc-ctx"
			tt.req.StagingTargetPath = e.kubelet + "/plugins/spindle/staging/pvc-ctx"
			tt.req.VolumeCapability = mountCap("ext4", snw)
			wantCode(t, e.NodeStage(tt.req), codes.InvalidArgument, tt.want...)
		})
	}
}
