package driver

import (
	"context"
	"encoding/base64"
	"sort"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// Page tokens name the last ID a page returned; the next page starts after
// it. Unlike an index, such a position stays meaningful when volumes are
// created or deleted between pages: nothing is returned twice, and nothing
// that existed throughout is skipped.
const pageTokenPrefix = "after:"

func encodePageToken(lastID string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(pageTokenPrefix + lastID))
}

// decodePageToken returns the ID a token starts after ("" for no token).
// A token this driver did not issue, or one naming a backend instance that
// is no longer configured, is ABORTED: the caller lists again from the start.
func (d *Driver) decodePageToken(token string) (string, error) {
	if token == "" {
		return "", nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	after, ok := strings.CutPrefix(string(raw), pageTokenPrefix)
	if err != nil || !ok {
		return "", errdefs.Busy("starting_token %q was not issued by this driver; list again from the start", token)
	}
	id, err := volumeid.Parse(after)
	if err != nil {
		return "", errdefs.Busy("starting_token %q is not a position this driver can resume from; list again from the start", token)
	}
	if _, ok := d.instances[id.InstanceKey()]; !ok {
		return "", errdefs.Busy("starting_token %q points into backend %s, which is no longer configured; list again from the start", token, id.InstanceKey())
	}
	return after, nil
}

// pageOf cuts the page after the token's position, at most maxEntries
// items, from items sorted ascending by idOf; it returns the page and the
// next token ("" on the last page).
func pageOf[T any](d *Driver, items []T, idOf func(T) string, startingToken string, maxEntries int32) ([]T, string, error) {
	if maxEntries < 0 {
		return nil, "", errdefs.InvalidArgument("max_entries must not be negative, got %d", maxEntries)
	}
	after, err := d.decodePageToken(startingToken)
	if err != nil {
		return nil, "", err
	}
	from := 0
	if after != "" {
		from = sort.Search(len(items), func(i int) bool { return idOf(items[i]) > after })
	}
	to, next := len(items), ""
	if maxEntries > 0 && from+int(maxEntries) < to {
		to = from + int(maxEntries)
		next = encodePageToken(idOf(items[to-1]))
	}
	return items[from:to], next, nil
}

// instanceImage is an image and the instance that holds it.
type instanceImage struct {
	id   string // the volume ID
	inst *backend.Instance
	img  *backend.Image
}

// allImages lists every image of every instance, sorted by volume ID.
func (d *Driver) allImages(ctx context.Context) ([]instanceImage, error) {
	var out []instanceImage
	for _, key := range d.instanceKeys() {
		inst := d.instances[key]
		imgs, err := inst.Store.List(ctx)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.ErrUnavailable, err, "list the volumes of backend %s", key)
		}
		for _, img := range imgs {
			out = append(out, instanceImage{id: key + "/" + img.ID, inst: inst, img: img})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out, nil
}

func publishedNodes(img *backend.Image) []string {
	nodes := make([]string, 0, len(img.Attachments))
	for _, a := range img.Attachments {
		nodes = append(nodes, a.NodeID)
	}
	return nodes
}

func (s *controllerService) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	all, err := s.d.allImages(ctx)
	if err != nil {
		return nil, err
	}
	page, next, err := pageOf(s.d, all, func(e instanceImage) string { return e.id }, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, e := range page {
		vol, err := s.d.csiVolume(e.inst, e.img)
		if err != nil {
			return nil, err
		}
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{
			Volume: vol,
			Status: &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: publishedNodes(e.img)},
		})
	}
	return resp, nil
}

func (s *controllerService) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	inst, err := s.d.instanceFor(id)
	if err != nil {
		return nil, err
	}
	img, err := inst.Store.Get(ctx, id.Image)
	if err != nil {
		return nil, err
	}
	vol, err := s.d.csiVolume(inst, img)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: vol,
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{PublishedNodeIds: publishedNodes(img)},
	}, nil
}

// GetCapacity reports what the instance the parameters select can still
// allocate. Capacity that a request could not use is reported as zero
// rather than refused: a capability the backend does not serve, or a
// topology that a node-local instance cannot reach.
func (s *controllerService) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	params, err := s.d.parseParameters(req.GetParameters())
	if err != nil {
		return nil, err
	}
	inst := s.d.instances[params.instance]
	minBytes := int64(capacityUnit)
	for i, vc := range req.GetVolumeCapabilities() {
		c, err := parseCapability("volume_capabilities["+strconv.Itoa(i)+"]", vc)
		if err != nil {
			return nil, err
		}
		if inst.Exporter.SupportsAccess(c.accessType, c.mode) != nil {
			return &csi.GetCapacityResponse{}, nil
		}
		if c.accessType == backend.AccessMount {
			if fs, err := blockdev.LookupFilesystem(c.fsType); err == nil && fs.MinBytes > minBytes {
				minBytes = fs.MinBytes
			}
		}
	}
	if t := req.GetAccessibleTopology(); t != nil && inst.NodeLocal && !s.d.topologyIncludesNode(t) {
		return &csi.GetCapacityResponse{}, nil
	}
	c, err := inst.Store.Capacity(ctx)
	if err != nil {
		return nil, err
	}
	// Volumes are whole MiB: what is left of a MiB cannot be allocated.
	available := c.AvailableBytes / capacityUnit * capacityUnit
	maximum := min(c.MaximumVolumeBytes/capacityUnit*capacityUnit, int64(maxCapacity))
	return &csi.GetCapacityResponse{
		AvailableCapacity: available,
		MaximumVolumeSize: wrapperspb.Int64(maximum),
		MinimumVolumeSize: wrapperspb.Int64(minBytes),
	}, nil
}
