package rbd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Images made outside Spindle. ceph-csi's static form names an existing
// image with a PersistentVolume: volumeHandle is the image's name and
// volumeAttributes say where it is (clusterID, pool, staticVolume "true",
// imageFeatures; radosNamespace, mounter, mapOptions, unmapOptions when
// wanted). Such a volume stages, mounts and grows on the node (after
// "rbd resize", at its next stage or NodeExpandVolume) and is never
// deleted, changed or recorded in: its image gets no metadata. A
// dynamically provisioned ceph-csi volume names its image in the
// attribute imageName, which kubectl spindle adopt reads (Adopt).

// cephCSIEncryptionKeys are the image-meta keys ceph-csi keeps on an image
// it encrypts (its encryption state, and with its metadata KMS the wrapped
// data key), in its current and its earlier spelling. Such an image holds
// LUKS whose key only ceph-csi's KMS has.
var cephCSIEncryptionKeys = []string{
	"rbd.csi.ceph.com/encrypted", ".rbd.csi.ceph.com/encrypted",
	"rbd.csi.ceph.com/dek", ".rbd.csi.ceph.com/dek",
}

// refuseCephCSIEncrypted refuses an image ceph-csi encrypted: adopted as a
// plain volume, its workload would get a LUKS header, not its filesystem,
// and Spindle cannot open it (its key is in ceph-csi's KMS).
func refuseCephCSIEncrypted(r ref, meta map[string]string) error {
	for _, k := range cephCSIEncryptionKeys {
		if v, ok := meta[k]; ok && v != "" {
			return errdefs.Precondition("adopt %s: ceph-csi encrypted this image (image-meta %s): its data is LUKS whose key is in ceph-csi's KMS, which Spindle cannot read, so it cannot become a Spindle volume in place; copy its data onto a Spindle volume (encrypted: \"true\" for one encrypted by Spindle) instead", r.spec(), k)
		}
	}
	return nil
}

// AttrImageName is the volumeAttributes key of a ceph-csi PersistentVolume
// that names its image (dynamically provisioned ones have it).
const AttrImageName = "imageName"

// StaticImage implements backend.StaticVolumes.
func (s *Store) StaticImage(handle string, attrs map[string]string) (string, error) {
	if attrs[backend.StaticVolumeAttribute] != "true" && attrs[AttrImageName] == "" {
		return "", errdefs.InvalidArgument("volume %q names no image: its volumeAttributes have neither %s \"true\" (with the image's name as volumeHandle) nor %s", handle, backend.StaticVolumeAttribute, AttrImageName)
	}
	image := handle
	if v := attrs[AttrImageName]; v != "" {
		image = v
	}
	if !imageNameRe.MatchString(image) {
		return "", errdefs.InvalidArgument("volume %q: image name %q is not one Spindle can use (letters, digits, '.', '_', '-', at most 100)", handle, image)
	}
	cluster, pool := attrs[ParamClusterID], attrs[ParamPool]
	known, err := s.c.knowsCluster(cluster)
	if err != nil && clusterIDRe.MatchString(cluster) {
		return "", err
	}
	switch {
	case cluster == "":
		return "", errdefs.InvalidArgument("volume %q: volumeAttributes.%s is required (the cluster of the image)", handle, ParamClusterID)
	case pool == "":
		return "", errdefs.InvalidArgument("volume %q: volumeAttributes.%s is required (the pool of the image)", handle, ParamPool)
	case !clusterIDRe.MatchString(cluster) || !known:
		return "", errdefs.InvalidArgument("volume %q: volumeAttributes.%s %q is neither rbd backend %s's own cluster nor in its cluster map%s", handle, ParamClusterID, cluster, s.key, mapName(s.cfg.ClusterMap))
	case !poolRe.MatchString(pool):
		return "", errdefs.InvalidArgument("volume %q: volumeAttributes.%s %q is not a pool name", handle, ParamPool, pool)
	}
	ns, err := s.namespaceFor(cluster, attrs)
	if err != nil {
		return "", err
	}
	if ns != "" && !namespaceRe.MatchString(ns) {
		return "", errdefs.InvalidArgument("volume %q: volumeAttributes.%s %q is not a namespace name", handle, ParamRadosNamespace, ns)
	}
	return s.idOf(location{cluster: cluster, pool: pool, namespace: ns}.ref(image)), nil
}

// StaticPublishContext implements backend.StaticVolumes: where the image
// is and how to map it, from the attributes (ceph-csi's mounter, map and
// unmap options, image features) and the instance's config. Nothing is
// asked of the cluster, and nothing is recorded: ControllerPublish of a
// static volume may carry no credentials at all.
func (s *Store) StaticPublishContext(imageID string, attrs map[string]string) (map[string]string, error) {
	r, err := s.volumeRef(imageID)
	if err != nil {
		return nil, err
	}
	mounter := s.cfg.Mounter
	if v, ok := attrs[ParamMounter]; ok {
		if mounter, ok = mounterNames[v]; !ok {
			return nil, errdefs.InvalidArgument("volumeAttributes.%s %q is not a mounter", ParamMounter, v)
		}
	}
	for _, k := range []string{ParamMapOptions, ParamUnmapOptions} {
		if _, err := parseMounterOptions(attrs[k]); err != nil {
			return nil, errdefs.InvalidArgument("volumeAttributes.%s %q: %v", k, attrs[k], err)
		}
	}
	if f, ok := attrs[ParamImageFeatures]; ok {
		if err := checkFeatures(f, mounter); err != nil {
			return nil, err
		}
	}
	mapOpts := s.defaultMapOptions(mounter)
	if v, ok := attrs[ParamMapOptions]; ok {
		mapOpts = optionsFor(v, mounter)
	}
	return s.publishContext(r, mounter, mapOpts, optionsFor(attrs[ParamUnmapOptions], mounter)), nil
}

// StaticAttacher implements backend.StaticVolumes.
func (s *Store) StaticAttacher() backend.Attacher {
	return &backend.TransportAttacher{Source: staticSource{s}, Transport: s.transport, NoGrants: true}
}

var _ backend.StaticVolumes = (*Store)(nil)

// staticSource is the store as a node reads a static image: its size, and
// nothing else, since the image carries no records.
type staticSource struct{ *Store }

// Get reads the image's size (with NodeStageVolume's credentials).
func (s staticSource) Get(ctx context.Context, imageID string) (*backend.Image, error) {
	r, err := s.volumeRef(imageID)
	if err != nil {
		return nil, err
	}
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return nil, err
	}
	info, err := cl.StatImage(ctx, r.cephImage(), "")
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return nil, errdefs.NotFound("image %s of the pre-provisioned volume does not exist", r.spec())
	}
	if err != nil {
		return nil, err
	}
	return &backend.Image{ID: imageID, Name: r.image, CapacityBytes: int64(info.Size)}, nil
}

// CheckAttach: the publish_context names the image of the ID.
func (s staticSource) CheckAttach(_ context.Context, img *backend.Image, req backend.AttachRequest) error {
	r, err := s.volumeRef(img.ID)
	if err != nil {
		return err
	}
	return checkContext(r, req.PublishContext)
}

// RecordFormatted records nothing: a static image is never written to
// but by its filesystem.
func (staticSource) RecordFormatted(context.Context, string, string) error { return nil }

// RegisterNode: the instance's own attacher registers the node.
func (staticSource) RegisterNode(context.Context, backend.NodeInfo) error { return nil }

// Probe: as source's.
func (staticSource) Probe(context.Context) error { return nil }

// Adopt implements backend.Adopter: the image gains a volume record (its
// CSI name, access type, filesystem, the StorageClass parameters it is
// kept under) in its metadata, in place; no data moves. Its filesystem is
// not recorded as formatted: the node finds it (blkid) at the first stage
// and records it then, so an image that was never formatted is formatted
// once, as any new volume.
//
// The image must be one the volume's mounter maps: its features as they
// are (an image of ceph-csi may have journaling, which krbd cannot map)
// are checked as a StorageClass's imageFeatures are, before anything is
// written. An image still open on a node is refused, but in a dry run:
// that comes before kubectl spindle adopt scales down what uses it, so it
// answers who has the image open.
func (s *Store) Adopt(ctx context.Context, spec backend.AdoptSpec) (*backend.Adopted, error) {
	r, err := s.volumeRef(spec.ImageID)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "adopt")
	}
	if spec.Name == "" {
		return nil, errdefs.InvalidArgument("adopt %s: the volume needs a name (its PersistentVolume's)", r.spec())
	}
	if spec.AccessType != backend.AccessMount && spec.AccessType != backend.AccessBlock {
		return nil, errdefs.InvalidArgument("adopt %s: access type %q is neither mount nor block", r.spec(), spec.AccessType)
	}
	opts, err := s.volumeOptionsOf(spec.Parameters)
	if err != nil {
		return nil, err
	}
	if opts.loc.cluster != r.cluster {
		return nil, errdefs.InvalidArgument("adopt %s: the image is in cluster %s, its StorageClass parameters name cluster %s", r.spec(), r.cluster, opts.loc.cluster)
	}
	id := s.idOf(r)
	defer s.locks.lock(id)()
	info, meta, err := s.read(ctx, r)
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return nil, errdefs.NotFound("adopt: image %s does not exist", r.spec())
	}
	if err != nil {
		return nil, err
	}
	if err := refuseCephCSIEncrypted(r, meta); err != nil {
		return nil, err
	}
	if name, ok := meta[metaName]; ok {
		switch {
		case name == spec.Name && meta[metaVolume] != "":
			return adopted(s.decode(id, r.image, info.Size, meta)) // adopted already
		case name != spec.Name:
			return nil, errdefs.Precondition("adopt %s: the image already is Spindle's %q", r.spec(), name)
		}
		// The name without the volume record: an adoption under this
		// name that stopped between the two writes; it is done again.
	}
	if err := checkFeatures(strings.Join(userFeatures(info.Features), ","), opts.mounter); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrPrecondition, err, "adopt %s: the image has features %s, and the StorageClass's mounter %s must map it", r.spec(), strings.Join(info.Features, ","), opts.mounter)
	}
	openBy, err := s.watchers(ctx, r)
	if err != nil {
		return nil, err
	}
	if len(openBy) > 0 && !spec.DryRun {
		return nil, errdefs.Precondition("adopt %s: the image is still open by %v (mapped on a node, or open by another client): nothing was changed; stop what uses it, then adopt it", r.spec(), openBy)
	}
	rec := volumeRecord{AccessType: spec.AccessType, FsType: spec.FsType, Parameters: spec.Parameters, CreatedAt: time.Now().UTC()}
	meta = map[string]string{metaName: spec.Name, metaVolume: mustJSON(rec)}
	if spec.DryRun {
		res, err := adopted(s.decode(id, r.image, info.Size, meta))
		if err == nil {
			res.OpenBy = openBy
		}
		return res, err
	}
	if err := s.rememberLocation(ctx, r.location); err != nil {
		return nil, err
	}
	if err := s.setMeta(ctx, r, meta); err != nil {
		// The keys are written one by one: take back what was, so that
		// the image is as it was (best effort; a retry under the same
		// name finishes a half-written one anyway).
		if rerr := s.setMeta(context.WithoutCancel(ctx), r, map[string]string{metaName: "", metaVolume: ""}); rerr != nil {
			return nil, errors.Join(err, fmt.Errorf("remove the records written: %w", rerr))
		}
		return nil, err
	}
	img, err := s.getImage(ctx, id)
	return adopted(img, err)
}

// adopted is the volume read back (or decoded) as Adopt's answer.
func adopted(img *backend.Image, err error) (*backend.Adopted, error) {
	if err != nil {
		return nil, err
	}
	return &backend.Adopted{Image: img}, nil
}

var _ backend.Adopter = (*Store)(nil)
