package conformance

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// TestMemoryBackend runs the suite against a minimal in-memory backend whose
// image IDs look like RBD's ("pool/csi-vol-…", with a slash) and which offers
// none of the optional hooks but attach and a mutable parameter, and no
// snapshots. It keeps the suite honest about being backend-neutral: nothing
// in it may depend on the loop backend's file layout or ID scheme.
func TestMemoryBackend(t *testing.T) {
	Run(t, func(t *testing.T, opts Options) *Fixture {
		m := &memBackend{capacity: opts.CapacityBytes, images: map[string]*backend.Image{}, nodes: map[string]backend.NodeInfo{}, devices: map[string]backend.Device{}}
		return &Fixture{
			Instance:          &backend.Instance{Type: "mem", Name: "test", Store: m, Exporter: m, Attacher: m},
			MutableParameters: map[string]string{"tier": "fast"},
		}
	})
}

// memUnbounded is the capacity the memory backend reports without a limit.
const memUnbounded = 1 << 40

// memBackend is every role at once, guarded by one mutex.
type memBackend struct {
	mu       sync.Mutex
	capacity int64
	images   map[string]*backend.Image
	nodes    map[string]backend.NodeInfo
	devices  map[string]backend.Device // by image ID; one device per image
	next     int
}

func memID(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "kube/csi-vol-" + hex.EncodeToString(sum[:8])
}

func (m *memBackend) Create(_ context.Context, spec backend.VolumeSpec) (*backend.Image, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if spec.CapacityBytes <= 0 {
		return nil, errdefs.InvalidArgument("capacity %d", spec.CapacityBytes)
	}
	if err := memValidateMutable(spec.MutableParameters); err != nil {
		return nil, err
	}
	if src := spec.Source; src != nil && (src.ImageID == "") == (src.SnapshotID == "") {
		return nil, errdefs.InvalidArgument("a content source names one volume or one snapshot")
	}
	id := memID(spec.Name)
	if img, ok := m.images[id]; ok {
		fits := (spec.RequiredBytes == 0 || img.CapacityBytes >= spec.RequiredBytes) &&
			(spec.LimitBytes == 0 || img.CapacityBytes <= spec.LimitBytes) &&
			(spec.RequiredBytes != 0 || spec.LimitBytes != 0 || img.CapacityBytes == spec.CapacityBytes)
		sameFs := img.FsType == spec.FsType || (spec.Source != nil && spec.FsType == "")
		sameSource := (img.Source == nil) == (spec.Source == nil) && (img.Source == nil || *img.Source == *spec.Source)
		if !fits || img.AccessType != spec.AccessType || !sameFs || !maps.Equal(img.Parameters, spec.Parameters) ||
			!maps.Equal(img.MutableParameters, spec.MutableParameters) || !sameSource {
			return nil, errdefs.AlreadyExists("volume %q exists with other parameters", spec.Name)
		}
		return img.Clone(), nil
	}
	img := &backend.Image{ID: id, Name: spec.Name, CapacityBytes: spec.CapacityBytes, AccessType: spec.AccessType, FsType: spec.FsType,
		Parameters: maps.Clone(spec.Parameters), MutableParameters: maps.Clone(spec.MutableParameters), Encryption: spec.Encryption.Clone()}
	if spec.Source != nil {
		if spec.Source.SnapshotID != "" {
			return nil, errdefs.NotFound("snapshot %s does not exist", spec.Source.SnapshotID)
		}
		src, ok := m.images[spec.Source.ImageID]
		switch {
		case !ok:
			return nil, errdefs.NotFound("source volume %s does not exist", spec.Source.ImageID)
		case src.AccessType != spec.AccessType:
			return nil, errdefs.InvalidArgument("source volume %s is a %s volume", src.ID, src.AccessType)
		case spec.FsType != "" && src.FsType != "" && spec.FsType != src.FsType:
			return nil, errdefs.InvalidArgument("source volume %s has fs type %s, not %s", src.ID, src.FsType, spec.FsType)
		case spec.CapacityBytes < src.CapacityBytes:
			return nil, errdefs.OutOfRange("source volume %s is %d bytes, more than %d", src.ID, src.CapacityBytes, spec.CapacityBytes)
		}
		source := *spec.Source
		img.Source, img.Formatted = &source, src.Formatted
		if src.FsType != "" {
			img.FsType = src.FsType
		}
	}
	if m.capacity > 0 && m.used()+spec.CapacityBytes > m.capacity {
		return nil, errdefs.Exhausted("no room for %d bytes", spec.CapacityBytes)
	}
	m.images[id] = img
	return img.Clone(), nil
}

func (m *memBackend) used() int64 {
	var used int64
	for _, img := range m.images {
		used += img.CapacityBytes
	}
	return used
}

// memValidateMutable understands one mutable parameter, "tier".
func memValidateMutable(mutable map[string]string) error {
	for k, v := range mutable {
		if k != "tier" || (v != "fast" && v != "slow") {
			return errdefs.InvalidArgument("mutable parameter %s=%q is not supported", k, v)
		}
	}
	return nil
}

func (m *memBackend) Delete(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if img, ok := m.images[id]; ok && len(img.Attachments) > 0 {
		return errdefs.Precondition("volume %s is published to %v", id, nodesOf(img))
	}
	delete(m.images, id)
	return nil
}

func (m *memBackend) Get(_ context.Context, id string) (*backend.Image, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	img, ok := m.images[id]
	if !ok {
		return nil, errdefs.NotFound("volume %s does not exist", id)
	}
	return img.Clone(), nil
}

func (m *memBackend) Probe(context.Context) error { return nil }

func (m *memBackend) SupportsAccess(t backend.AccessType, mode backend.AccessMode) error {
	if t != backend.AccessMount && t != backend.AccessBlock {
		return errdefs.InvalidArgument("access type %q", t)
	}
	switch mode {
	case backend.SingleNodeWriter, backend.SingleNodeReaderOnly, backend.MultiNodeReaderOnly:
		return nil
	}
	return errdefs.InvalidArgument("access mode %s is not supported", mode)
}

func (m *memBackend) Publish(_ context.Context, id string, att backend.Attachment) (map[string]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	node, ok := m.nodes[att.NodeID]
	img, exists := m.images[id]
	if !ok {
		if exists {
			if _, conflict := backend.Admit(img, att); conflict != nil {
				return nil, conflict
			}
		}
		return nil, errdefs.NotFound("node %q is not registered", att.NodeID)
	}
	if !exists {
		return nil, errdefs.NotFound("volume %s does not exist", id)
	}
	already, err := backend.Admit(img, att)
	if err != nil {
		return nil, err
	}
	if !already {
		if node.MaxVolumesPerNode > 0 {
			var n int64
			for _, other := range m.images {
				if slices.Contains(nodesOf(other), att.NodeID) {
					n++
				}
			}
			if n >= node.MaxVolumesPerNode {
				return nil, errdefs.Exhausted("node %q has %d volumes, its limit of %d", att.NodeID, n, node.MaxVolumesPerNode)
			}
		}
		img.Attachments = append(img.Attachments, att)
	}
	for _, a := range img.Attachments {
		if a.NodeID == att.NodeID {
			return map[string]string{backend.ContextReadOnly: strconv.FormatBool(a.ReadOnly)}, nil
		}
	}
	panic("unreachable")
}

func (m *memBackend) Unpublish(_ context.Context, id, nodeID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if img, ok := m.images[id]; ok {
		img.Attachments, _ = backend.Detached(img.Attachments, nodeID)
	}
	return nil
}

func (m *memBackend) Attach(_ context.Context, req backend.AttachRequest) (*backend.Device, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	img, ok := m.images[req.ImageID]
	if !ok {
		return nil, errdefs.NotFound("volume %s does not exist", req.ImageID)
	}
	var att *backend.Attachment
	for i := range img.Attachments {
		if img.Attachments[i].NodeID == req.NodeID {
			att = &img.Attachments[i]
		}
	}
	if att == nil {
		return nil, errdefs.Precondition("volume %s is not published to node %q", req.ImageID, req.NodeID)
	}
	d, ok := m.devices[req.ImageID]
	if !ok {
		d = backend.Device{Path: fmt.Sprintf("/dev/mem%d", m.next), ReadOnly: req.ReadOnly || att.ReadOnly}
		m.next++
		m.devices[req.ImageID] = d
	}
	d.Formatted, d.FsType = img.Formatted, img.FsType
	return &d, nil
}

func (m *memBackend) Detach(_ context.Context, id, devicePath string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d, ok := m.devices[id]; ok && (devicePath == "" || d.Path == devicePath) {
		delete(m.devices, id)
	}
	return nil
}

func (m *memBackend) Devices(_ context.Context, id string) ([]backend.Device, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d, ok := m.devices[id]; ok {
		return []backend.Device{d}, nil
	}
	return nil, nil
}

func (m *memBackend) Identify(_ context.Context, id, devicePath string) (*backend.Device, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d, ok := m.devices[id]; ok && d.Path == devicePath {
		return &d, nil
	}
	return nil, errdefs.NotFound("%s is not a device of %s", devicePath, id)
}

func (m *memBackend) List(context.Context) ([]*backend.Image, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*backend.Image
	for _, id := range slices.Sorted(maps.Keys(m.images)) {
		out = append(out, m.images[id].Clone())
	}
	return out, nil
}

func (m *memBackend) Expand(_ context.Context, id string, size int64) (*backend.Image, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	img, ok := m.images[id]
	switch {
	case !ok:
		return nil, errdefs.NotFound("volume %s does not exist", id)
	case size < img.CapacityBytes:
		return nil, errdefs.OutOfRange("volume %s is %d bytes, cannot shrink to %d", id, img.CapacityBytes, size)
	case m.capacity > 0 && m.used()+size-img.CapacityBytes > m.capacity:
		return nil, errdefs.Exhausted("no room to grow %s to %d bytes", id, size)
	}
	img.CapacityBytes = size
	return img.Clone(), nil
}

func (m *memBackend) Modify(_ context.Context, id string, mutable map[string]string) (*backend.Image, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := memValidateMutable(mutable); err != nil {
		return nil, err
	}
	img, ok := m.images[id]
	if !ok {
		return nil, errdefs.NotFound("volume %s does not exist", id)
	}
	if len(mutable) > 0 {
		if img.MutableParameters == nil {
			img.MutableParameters = map[string]string{}
		}
		maps.Copy(img.MutableParameters, mutable)
	}
	return img.Clone(), nil
}

// SetEncryption implements backend.EncryptionKeeper (key rotation).
func (m *memBackend) SetEncryption(_ context.Context, id string, e *backend.Encryption) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	img, ok := m.images[id]
	if !ok {
		return errdefs.NotFound("volume %s does not exist", id)
	}
	img.Encryption = e.Clone()
	return nil
}

func (m *memBackend) Capacity(context.Context) (backend.Capacity, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	avail := int64(memUnbounded)
	if m.capacity > 0 {
		avail = max(m.capacity-m.used(), 0)
	}
	return backend.Capacity{AvailableBytes: avail, MaximumVolumeBytes: avail}, nil
}

func (m *memBackend) Refresh(_ context.Context, id, devicePath string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d, ok := m.devices[id]; ok && d.Path == devicePath {
		return m.images[id].CapacityBytes, nil
	}
	return 0, errdefs.NotFound("%s is not a device of %s", devicePath, id)
}

func (m *memBackend) RecordFormatted(_ context.Context, id, fsType string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	img, ok := m.images[id]
	if !ok {
		return errdefs.NotFound("volume %s does not exist", id)
	}
	img.Formatted, img.FsType = true, fsType
	return nil
}

func (m *memBackend) RegisterNode(_ context.Context, info backend.NodeInfo) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nodes[info.NodeID] = info
	return nil
}
