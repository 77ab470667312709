package controller

import (
	"context"
	"slices"
	"strings"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// instanceImage is an image and the instance that holds it.
type instanceImage struct {
	id   string // the volume ID
	inst *backend.Instance
	img  *backend.Image
}

// allImages lists every image of every instance, sorted by volume ID.
func (c *Controller) allImages(ctx context.Context) ([]instanceImage, error) {
	var out []instanceImage
	for _, key := range c.instances.Keys() {
		inst := c.instances[key]
		imgs, err := inst.Store.List(ctx)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.ErrUnavailable, err, "list the volumes of backend %s", key)
		}
		for _, img := range imgs {
			out = append(out, instanceImage{id: key + "/" + img.ID, inst: inst, img: img})
		}
	}
	slices.SortFunc(out, func(a, b instanceImage) int { return strings.Compare(a.id, b.id) })
	return out, nil
}

// ListVolumes lists every volume of every instance, sorted by ID.
func (c *Controller) ListVolumes(ctx context.Context) ([]*Volume, error) {
	all, err := c.allImages(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*Volume, 0, len(all))
	for _, e := range all {
		vol, err := c.describe(e.inst, e.img)
		if err != nil {
			return nil, err
		}
		out = append(out, vol)
	}
	return out, nil
}

// GetVolume describes the volume id.
func (c *Controller) GetVolume(ctx context.Context, id volumeid.ID) (*Volume, error) {
	inst, img, err := c.image(ctx, id)
	if err != nil {
		return nil, err
	}
	return c.describe(inst, img)
}

// Capacity is what GetCapacity reports.
type Capacity struct {
	AvailableBytes, MaximumVolumeBytes, MinimumVolumeBytes int64
}

// Capacity reports what the instance the parameters select can still
// allocate for volumes of caps, usable from topology (nil: anywhere).
// Capacity that such a volume could not use is nil rather than refused: a
// capability the backend does not serve, or a topology that a node-local
// instance cannot reach.
func (c *Controller) Capacity(ctx context.Context, params map[string]string, caps []Capability, topology Topology) (*Capacity, error) {
	vp, err := c.parseParameters(params)
	if err != nil {
		return nil, err
	}
	inst := c.instances[vp.instance]
	minBytes := capacityUnit
	for _, cp := range caps {
		if inst.Exporter.SupportsAccess(cp.Access, cp.Mode) != nil {
			return nil, nil
		}
		if cp.Access == backend.AccessMount {
			if fs, err := blockdev.LookupFilesystem(cp.FsType); err == nil && fs.MinBytes > minBytes {
				minBytes = fs.MinBytes
			}
		}
	}
	if topology != nil && inst.NodeLocal && !c.includesNode(topology) {
		return nil, nil
	}
	got, err := inst.Store.Capacity(ctx)
	if err != nil {
		return nil, err
	}
	// Volumes are whole MiB: what is left of a MiB cannot be allocated.
	return &Capacity{
		AvailableBytes:     got.AvailableBytes / capacityUnit * capacityUnit,
		MaximumVolumeBytes: min(got.MaximumVolumeBytes/capacityUnit*capacityUnit, int64(MaxCapacity)),
		MinimumVolumeBytes: minBytes,
	}, nil
}

// HealthStatus is how bad a health problem is.
type HealthStatus int

const (
	// Inaccessible: the volume cannot be used (the node side's problems).
	Inaccessible HealthStatus = iota
	// Degraded: the volume serves, in part (a filesystem the kernel made
	// read-only), or its state cannot be checked.
	Degraded
	// DataLoss: the volume's data is gone.
	DataLoss
)

// HealthProblem is one abnormal condition of a volume.
type HealthProblem struct {
	Status  HealthStatus
	Reason  string // CamelCase, for machines and short displays
	Message string
}

// VolumeHealth is a volume's problems.
type VolumeHealth struct {
	VolumeID string
	Problems []HealthProblem
}

// ImageHealth reports an image whose data is gone (DataLoss) or cannot be
// checked (Degraded), as checker (the store, or a node's attacher) sees it;
// nothing when checker cannot check images (backend.ImageChecker).
func ImageHealth(ctx context.Context, checker any, imageID string) []HealthProblem {
	ic, ok := checker.(backend.ImageChecker)
	if !ok {
		return nil
	}
	err := ic.CheckImage(ctx, imageID)
	switch {
	case err == nil:
		return nil
	case errdefs.KindOf(err) == errdefs.ErrNotFound:
		return []HealthProblem{{DataLoss, "ImageMissing", err.Error()}}
	default:
		return []HealthProblem{{Degraded, "ImageUnreadable", err.Error()}}
	}
}

// VolumeHealth checks the volume id's image.
func (c *Controller) VolumeHealth(ctx context.Context, id volumeid.ID) ([]HealthProblem, error) {
	inst, _, err := c.image(ctx, id)
	if err != nil {
		return nil, err
	}
	return ImageHealth(ctx, inst.Store, id.Image), nil
}

// ListVolumeHealth lists the volumes that have a problem, sorted by ID, as
// the spec asks: healthy ones are left out.
func (c *Controller) ListVolumeHealth(ctx context.Context) ([]VolumeHealth, error) {
	all, err := c.allImages(ctx)
	if err != nil {
		return nil, err
	}
	var sick []VolumeHealth
	for _, e := range all {
		if ps := ImageHealth(ctx, e.inst.Store, e.img.ID); len(ps) > 0 {
			sick = append(sick, VolumeHealth{e.id, ps})
		}
	}
	return sick, nil
}
