// Package lifecycle drives one Spindle volume through the calls Kubernetes
// makes, in the order it makes them, over the driver's real socket:
// CreateVolume, ControllerPublishVolume, NodeStageVolume, NodePublishVolume
// and back. The lifecycle tests, `make demo` and `make bench` all use it, so
// what the demo prints and what the benchmark measures is what the tests check.
package lifecycle

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/spindle-csi/spindle/e2e/harness"
)

// Step names, as printed by the demo and aggregated by the benchmark.
const (
	StepCreate              = "CreateVolume"
	StepControllerPublish   = "ControllerPublishVolume"
	StepStage               = "NodeStageVolume"
	StepPublish             = "NodePublishVolume"
	StepUnpublish           = "NodeUnpublishVolume"
	StepUnstage             = "NodeUnstageVolume"
	StepControllerUnpublish = "ControllerUnpublishVolume"
	StepDelete              = "DeleteVolume"
	StepSnapshot            = "CreateSnapshot"
	StepDeleteSnapshot      = "DeleteSnapshot"
	StepControllerExpand    = "ControllerExpandVolume"
	StepNodeExpand          = "NodeExpandVolume"
	StepModify              = "ControllerModifyVolume"
)

// Observer is told about every RPC the Client makes.
type Observer func(step, volumeID string, elapsed time.Duration, err error)

// Client makes the lifecycle calls on a driver as the node harness.NodeID.
type Client struct {
	Driver  *harness.Driver
	NodeID  string
	Observe Observer // may be nil
	// Timeout bounds each RPC; 0 means 2 minutes.
	Timeout time.Duration
	// Secrets go with ControllerPublish, NodeStage and NodePublish, as
	// the StorageClass's *-secret-name parameters make Kubernetes send
	// them (iSCSI CHAP credentials).
	Secrets map[string]string
	// ControllerSecrets go with CreateVolume, DeleteVolume, CreateSnapshot
	// and DeleteSnapshot, as the provisioner and snapshotter secrets do
	// (an encrypted volume's KMS secret).
	ControllerSecrets map[string]string
}

// NewClient returns a Client for drv acting as the harness node.
func NewClient(drv *harness.Driver, observe Observer) *Client {
	return &Client{Driver: drv, NodeID: harness.NodeID, Observe: observe}
}

// Volume is a volume as the CO sees it while driving it.
type Volume struct {
	ID             string
	Name           string
	CapacityBytes  int64
	Capability     *csi.VolumeCapability
	VolumeContext  map[string]string
	PublishContext map[string]string
	StagingPath    string
}

// Block reports whether the volume is consumed as a raw device.
func (v *Volume) Block() bool { return v.Capability.GetBlock() != nil }

// MountCapability is a SINGLE_NODE_WRITER filesystem capability.
func MountCapability(fsType string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// BlockCapability is a SINGLE_NODE_WRITER raw block capability.
func BlockCapability() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// call times one RPC and reports it.
func (c *Client) call(ctx context.Context, step, volumeID string, rpc func(context.Context) error) error {
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	err := rpc(ctx)
	if c.Observe != nil {
		c.Observe(step, volumeID, time.Since(start), err)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", step, volumeID, err)
	}
	return nil
}

// Create asks for a volume of size bytes with capability vc. stagingPath is
// where the volume will be staged (kubelet's globalmount, here any directory
// path; for block volumes a path whose parent exists).
func (c *Client) Create(ctx context.Context, name string, size int64, vc *csi.VolumeCapability, params map[string]string, stagingPath string) (*Volume, error) {
	return c.CreateFrom(ctx, name, size, vc, params, stagingPath, nil)
}

// CreateFrom is Create with a content source: a snapshot (FromSnapshot) or
// another volume (FromVolume). size 0 takes the source's size.
func (c *Client) CreateFrom(ctx context.Context, name string, size int64, vc *csi.VolumeCapability, params map[string]string, stagingPath string, source *csi.VolumeContentSource) (*Volume, error) {
	v := &Volume{Name: name, Capability: vc, StagingPath: stagingPath}
	err := c.call(ctx, StepCreate, name, func(ctx context.Context) error {
		req := &csi.CreateVolumeRequest{
			Name:                name,
			VolumeCapabilities:  []*csi.VolumeCapability{vc},
			Parameters:          params,
			VolumeContentSource: source,
			Secrets:             c.ControllerSecrets,
		}
		if size > 0 {
			req.CapacityRange = &csi.CapacityRange{RequiredBytes: size}
		}
		resp, err := c.Driver.Controller.CreateVolume(ctx, req)
		if err != nil {
			return err
		}
		v.ID = resp.GetVolume().GetVolumeId()
		v.CapacityBytes = resp.GetVolume().GetCapacityBytes()
		v.VolumeContext = resp.GetVolume().GetVolumeContext()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return v, nil
}

// ControllerPublish grants this node access, as the external-attacher does.
func (c *Client) ControllerPublish(ctx context.Context, v *Volume) error {
	return c.call(ctx, StepControllerPublish, v.ID, func(ctx context.Context) error {
		resp, err := c.Driver.Controller.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{
			VolumeId: v.ID, NodeId: c.NodeID, VolumeCapability: v.Capability, VolumeContext: v.VolumeContext,
			Secrets: c.Secrets,
		})
		if err != nil {
			return err
		}
		v.PublishContext = resp.GetPublishContext()
		return nil
	})
}

// Stage attaches (and, the first time, formats) the volume at its staging path.
func (c *Client) Stage(ctx context.Context, v *Volume) error {
	return c.call(ctx, StepStage, v.ID, func(ctx context.Context) error {
		_, err := c.Driver.Node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
			VolumeId: v.ID, PublishContext: v.PublishContext, StagingTargetPath: v.StagingPath,
			VolumeCapability: v.Capability, VolumeContext: v.VolumeContext, Secrets: c.Secrets,
		})
		return err
	})
}

// Publish makes the volume visible at target, as kubelet does for a pod.
func (c *Client) Publish(ctx context.Context, v *Volume, target string, readOnly bool) error {
	return c.call(ctx, StepPublish, v.ID, func(ctx context.Context) error {
		_, err := c.Driver.Node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
			VolumeId: v.ID, PublishContext: v.PublishContext, StagingTargetPath: v.StagingPath,
			TargetPath: target, VolumeCapability: v.Capability, Readonly: readOnly, VolumeContext: v.VolumeContext,
			Secrets: c.Secrets,
		})
		return err
	})
}

// Unpublish removes the volume from target.
func (c *Client) Unpublish(ctx context.Context, v *Volume, target string) error {
	return c.call(ctx, StepUnpublish, v.ID, func(ctx context.Context) error {
		_, err := c.Driver.Node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.ID, TargetPath: target})
		return err
	})
}

// Unstage unmounts the staging path and detaches the device.
func (c *Client) Unstage(ctx context.Context, v *Volume) error {
	return c.call(ctx, StepUnstage, v.ID, func(ctx context.Context) error {
		_, err := c.Driver.Node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.ID, StagingTargetPath: v.StagingPath})
		return err
	})
}

// ControllerUnpublish revokes this node's access.
func (c *Client) ControllerUnpublish(ctx context.Context, v *Volume) error {
	return c.call(ctx, StepControllerUnpublish, v.ID, func(ctx context.Context) error {
		_, err := c.Driver.Controller.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: v.ID, NodeId: c.NodeID})
		return err
	})
}

// Delete deletes the volume.
func (c *Client) Delete(ctx context.Context, v *Volume) error {
	return c.call(ctx, StepDelete, v.ID, func(ctx context.Context) error {
		_, err := c.Driver.Controller.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.ID, Secrets: c.ControllerSecrets})
		return err
	})
}

// FromSnapshot is a content source naming a snapshot.
func FromSnapshot(snapshotID string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapshotID}}}
}

// FromVolume is a content source naming a volume (a clone).
func FromVolume(volumeID string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: volumeID}}}
}

// Snapshot takes a snapshot of v and returns its ID.
func (c *Client) Snapshot(ctx context.Context, name string, v *Volume) (string, error) {
	var id string
	err := c.call(ctx, StepSnapshot, v.ID, func(ctx context.Context) error {
		resp, err := c.Driver.Controller.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: v.ID, Secrets: c.ControllerSecrets})
		if err != nil {
			return err
		}
		if !resp.GetSnapshot().GetReadyToUse() {
			return fmt.Errorf("snapshot %s is not ready to use", resp.GetSnapshot().GetSnapshotId())
		}
		id = resp.GetSnapshot().GetSnapshotId()
		return nil
	})
	return id, err
}

// DeleteSnapshot deletes a snapshot.
func (c *Client) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	return c.call(ctx, StepDeleteSnapshot, snapshotID, func(ctx context.Context) error {
		_, err := c.Driver.Controller.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snapshotID, Secrets: c.ControllerSecrets})
		return err
	})
}

// ControllerExpand grows v to size bytes, as the external-resizer does.
func (c *Client) ControllerExpand(ctx context.Context, v *Volume, size int64) error {
	return c.call(ctx, StepControllerExpand, v.ID, func(ctx context.Context) error {
		resp, err := c.Driver.Controller.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
			VolumeId: v.ID, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapability: v.Capability,
		})
		if err != nil {
			return err
		}
		v.CapacityBytes = resp.GetCapacityBytes()
		return nil
	})
}

// Modify sets v's mutable parameters, as the external-resizer does when a
// PVC's VolumeAttributesClass changes.
func (c *Client) Modify(ctx context.Context, v *Volume, params map[string]string) error {
	return c.call(ctx, StepModify, v.ID, func(ctx context.Context) error {
		_, err := c.Driver.Controller.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{
			VolumeId: v.ID, MutableParameters: params, Secrets: c.Secrets,
		})
		return err
	})
}

// NodeExpand has the node grow v at path (its staging path or a pod's), as
// kubelet does after ControllerExpand; it returns the size the node sees.
func (c *Client) NodeExpand(ctx context.Context, v *Volume, path string) (int64, error) {
	var size int64
	err := c.call(ctx, StepNodeExpand, v.ID, func(ctx context.Context) error {
		resp, err := c.Driver.Node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
			VolumeId: v.ID, VolumePath: path, StagingTargetPath: v.StagingPath, VolumeCapability: v.Capability,
			CapacityRange: &csi.CapacityRange{RequiredBytes: v.CapacityBytes},
		})
		size = resp.GetCapacityBytes()
		return err
	})
	return size, err
}

// Attach is ControllerPublish then Stage; Detach is Unstage then
// ControllerUnpublish. Together with Create and Delete they are the steps
// that do not depend on pods.
func (c *Client) Attach(ctx context.Context, v *Volume) error {
	if err := c.ControllerPublish(ctx, v); err != nil {
		return err
	}
	return c.Stage(ctx, v)
}

// Detach undoes Attach.
func (c *Client) Detach(ctx context.Context, v *Volume) error {
	if err := c.Unstage(ctx, v); err != nil {
		return err
	}
	return c.ControllerUnpublish(ctx, v)
}

// Payload is data written into a volume and checked when read back.
type Payload struct {
	Data   []byte
	Sha256 string
}

// NewPayload returns n random bytes and their checksum.
func NewPayload(n int) Payload {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	sum := sha256.Sum256(b)
	return Payload{Data: b, Sha256: hex.EncodeToString(sum[:])}
}

// payloadFile is the file a filesystem volume's payload lives in.
const payloadFile = "payload.bin"

// Write stores p in the volume published at target: a file for filesystem
// volumes, the first len(p) bytes of the device for block volumes. The
// data is synced, as a database would, so it has reached the image file.
func Write(v *Volume, target string, p Payload) error {
	var f *os.File
	var err error
	if v.Block() {
		f, err = os.OpenFile(target, os.O_WRONLY, 0)
	} else {
		f, err = os.OpenFile(filepath.Join(target, payloadFile), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	}
	if err != nil {
		return err
	}
	if _, err := f.Write(p.Data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Read returns the checksum of the payload stored in the volume published
// at target (n bytes of it, for block volumes).
func Read(v *Volume, target string, n int) (string, error) {
	path := target
	if !v.Block() {
		path = filepath.Join(target, payloadFile)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyN(h, f, int64(n)); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Check reads the payload back from target and compares it with p.
func Check(v *Volume, target string, p Payload) error {
	got, err := Read(v, target, len(p.Data))
	if err != nil {
		return err
	}
	if got != p.Sha256 {
		return fmt.Errorf("checksum at %s is %s, want %s: the data did not survive", target, got, p.Sha256)
	}
	return nil
}

// FileHash is the checksum of a whole file (an image in the pool, say), to
// show that a refused operation left it untouched.
func FileHash(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Spec is one volume to take through the full lifecycle.
type Spec struct {
	Name       string
	SizeBytes  int64
	Capability *csi.VolumeCapability
	Parameters map[string]string
	// WorkDir holds the staging path and the two target paths; it must exist.
	WorkDir string
	// PayloadBytes is how much data is written and checked (default 1 MiB).
	PayloadBytes int
}

// Data steps, reported to the Observer like the RPCs.
const (
	StepWrite = "write payload"
	StepRead  = "read payload"
)

// Paths returns the staging path and the two pod target paths of a spec,
// laid out like kubelet's: block volumes stage and publish onto files whose
// parent directories exist.
func (s Spec) Paths() (staging string, targets [2]string) {
	staging = filepath.Join(s.WorkDir, "globalmount")
	for i := range targets {
		targets[i] = filepath.Join(s.WorkDir, fmt.Sprintf("pod-%d", i+1), "volume")
	}
	return staging, targets
}

// Full takes one volume through everything Kubernetes does with it:
// create → controller publish → stage → publish to two pods → write through
// one pod, read through the other → unpublish both → unstage → stage again →
// publish → the data is still there → unpublish → unstage → controller
// unpublish → delete. On failure it tears down what it can, so a failed run
// leaves as little behind as possible, and returns the first error.
func (c *Client) Full(ctx context.Context, s Spec) (err error) {
	n := s.PayloadBytes
	if n == 0 {
		n = 1 << 20
	}
	staging, targets := s.Paths()
	for _, t := range targets {
		if err := os.MkdirAll(filepath.Dir(t), 0o750); err != nil {
			return err
		}
	}
	v, err := c.Create(ctx, s.Name, s.SizeBytes, s.Capability, s.Parameters, staging)
	if err != nil {
		return err
	}
	// Tear down in reverse on any failure; every step is idempotent, so
	// repeating one that already ran is harmless.
	defer func() {
		if err == nil {
			return
		}
		ctx := context.WithoutCancel(ctx)
		for _, t := range targets {
			_ = c.Unpublish(ctx, v, t)
		}
		_ = c.Unstage(ctx, v)
		_ = c.ControllerUnpublish(ctx, v)
		_ = c.Delete(ctx, v)
	}()

	if err := c.Attach(ctx, v); err != nil {
		return err
	}
	for _, t := range targets {
		if err := c.Publish(ctx, v, t, false); err != nil {
			return err
		}
	}
	p := NewPayload(n)
	if err := c.data(StepWrite, v.ID, func() error { return Write(v, targets[0], p) }); err != nil {
		return err
	}
	if err := c.data(StepRead, v.ID, func() error { return Check(v, targets[1], p) }); err != nil {
		return err
	}
	for _, t := range targets {
		if err := c.Unpublish(ctx, v, t); err != nil {
			return err
		}
	}
	if err := c.Unstage(ctx, v); err != nil {
		return err
	}
	if err := c.Stage(ctx, v); err != nil {
		return err
	}
	if err := c.Publish(ctx, v, targets[0], false); err != nil {
		return err
	}
	if err := c.data(StepRead, v.ID, func() error { return Check(v, targets[0], p) }); err != nil {
		return err
	}
	if err := c.Unpublish(ctx, v, targets[0]); err != nil {
		return err
	}
	if err := c.Detach(ctx, v); err != nil {
		return err
	}
	return c.Delete(ctx, v)
}

func (c *Client) data(step, volumeID string, fn func() error) error {
	start := time.Now()
	err := fn()
	if c.Observe != nil {
		c.Observe(step, volumeID, time.Since(start), err)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", step, volumeID, err)
	}
	return nil
}
