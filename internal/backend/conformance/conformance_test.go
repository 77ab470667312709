package conformance

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// TestMemoryBackend runs the suite against a minimal in-memory backend whose
// image IDs look like RBD's ("pool/csi-vol-…", with a slash) and which offers
// none of the optional hooks but attach. It keeps the suite honest about
// being backend-neutral: nothing in it may depend on the loop backend's file
// layout or ID scheme.
func TestMemoryBackend(t *testing.T) {
	Run(t, func(t *testing.T, opts Options) *Fixture {
		m := &memBackend{capacity: opts.CapacityBytes, images: map[string]*backend.Image{}, nodes: map[string]bool{}, devices: map[string]backend.Device{}}
		return &Fixture{Instance: &backend.Instance{Type: "mem", Name: "test", Store: m, Exporter: m, Attacher: m}}
	})
}

// memBackend is every role at once, guarded by one mutex.
type memBackend struct {
	mu       sync.Mutex
	capacity int64
	images   map[string]*backend.Image
	nodes    map[string]bool
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
	id := memID(spec.Name)
	if img, ok := m.images[id]; ok {
		fits := (spec.RequiredBytes == 0 || img.CapacityBytes >= spec.RequiredBytes) &&
			(spec.LimitBytes == 0 || img.CapacityBytes <= spec.LimitBytes) &&
			(spec.RequiredBytes != 0 || spec.LimitBytes != 0 || img.CapacityBytes == spec.CapacityBytes)
		if !fits || img.AccessType != spec.AccessType || img.FsType != spec.FsType || !maps.Equal(img.Parameters, spec.Parameters) {
			return nil, errdefs.AlreadyExists("volume %q exists with other parameters", spec.Name)
		}
		return img.Clone(), nil
	}
	if m.capacity > 0 {
		used := spec.CapacityBytes
		for _, img := range m.images {
			used += img.CapacityBytes
		}
		if used > m.capacity {
			return nil, errdefs.Exhausted("no room for %d bytes", spec.CapacityBytes)
		}
	}
	img := &backend.Image{ID: id, Name: spec.Name, CapacityBytes: spec.CapacityBytes, AccessType: spec.AccessType, FsType: spec.FsType, Parameters: maps.Clone(spec.Parameters)}
	m.images[id] = img
	return img.Clone(), nil
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
	if !m.nodes[att.NodeID] {
		return nil, errdefs.NotFound("node %q is not registered", att.NodeID)
	}
	img, ok := m.images[id]
	if !ok {
		return nil, errdefs.NotFound("volume %s does not exist", id)
	}
	already, err := backend.Admit(img, att)
	if err != nil {
		return nil, err
	}
	if !already {
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

func (m *memBackend) List(context.Context) ([]*backend.Image, error) { return nil, nil }
func (m *memBackend) Expand(context.Context, string, int64) (*backend.Image, error) {
	return nil, errdefs.InvalidArgument("not supported")
}
func (m *memBackend) Modify(context.Context, string, map[string]string) (*backend.Image, error) {
	return nil, errdefs.InvalidArgument("not supported")
}
func (m *memBackend) Capacity(context.Context) (backend.Capacity, error) {
	return backend.Capacity{}, nil
}
func (m *memBackend) Refresh(context.Context, string, string) (int64, error) { return 0, nil }

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
	m.nodes[info.NodeID] = true
	return nil
}
