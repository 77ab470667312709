package rbd

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// StorageClass and VolumeSnapshotClass parameters of the rbd backend:
// ceph-csi's, with ceph-csi's meaning, so that a Rook or ceph-csi
// StorageClass works with only its provisioner changed. The driver keeps
// its own keys (backend, mkfsOptions, encrypted, encryptionKMSID,
// csi.storage.k8s.io/*) and hands the rest here; what a volume was created with is kept in its metadata (the
// volume record) and read back wherever it matters (the node maps with the
// volume's mounter and options). A key that needs something Spindle cannot
// do is refused naming the key and why, never ignored.
const (
	ParamClusterID          = "clusterID"
	ParamPool               = "pool"
	ParamDataPool           = "dataPool"
	ParamRadosNamespace     = "radosNamespace"
	ParamImageFeatures      = "imageFeatures"
	ParamImageFormat        = "imageFormat"
	ParamMounter            = "mounter"
	ParamMapOptions         = "mapOptions"
	ParamUnmapOptions       = "unmapOptions"
	ParamVolumeNamePrefix   = "volumeNamePrefix"
	ParamSnapshotNamePrefix = "snapshotNamePrefix"
	ParamStripeUnit         = "stripeUnit"
	ParamStripeCount        = "stripeCount"
	ParamObjectSize         = "objectSize"
	ParamTryOtherMounters   = "tryOtherMounters"
)

// refusedParameters are ceph-csi's keys that need a capability Spindle
// lacks, with the reason the refusal gives.
var refusedParameters = map[string]string{
	"topologyConstrainedPools": "Spindle places a volume in the one pool its StorageClass names (pool); it has no topology-constrained pools",
	"cephLogDir":               "Spindle keeps no per-volume rbd-nbd log files",
	"cephLogStrategy":          "Spindle keeps no per-volume rbd-nbd log files",
	"thickProvision":           "Spindle's images are thin; it never writes a new image full",
	"journalPool":              "Spindle keeps a volume's records in the image's own metadata, not in an omap journal",
	"encryptionType":           encryptionFixed,
	"encryptionCipher":         encryptionFixed,
	"encryptionKeySize":        encryptionFixed,
	"encryptionSectorSize":     encryptionFixed,
	"integrityMode":            "Spindle's encrypted volumes have no dm-integrity layer",
}

// qosParameters are ceph-csi's QoS keys: refused, Spindle sets no limits.
var qosParameters = []string{
	"baseIops", "maxIops", "baseReadIops", "maxReadIops", "baseWriteIops", "maxWriteIops",
	"baseBps", "maxBps", "baseReadBps", "maxReadBps", "baseWriteBps", "maxWriteBps",
	"iopsPerGiB", "readIopsPerGiB", "writeIopsPerGiB", "bpsPerGiB", "readBpsPerGiB", "writeBpsPerGiB",
	"baseVolSizeBytes",
}

// encryptionFixed is why ceph-csi's encryption tuning keys are refused
// (encrypted and encryptionKMSID are the driver's, for every backend: the
// volume is LUKS2 of internal/node's one format).
const encryptionFixed = "Spindle's encrypted volumes are block-level LUKS2 with one fixed format (aes-xts-plain64, 512-bit key, 4096-byte sectors); it is not chosen per StorageClass"

// Image features ceph-csi takes, and what each needs.
var featureNeeds = map[string]string{
	"layering":       "",
	"exclusive-lock": "",
	"object-map":     "exclusive-lock",
	"fast-diff":      "object-map",
	"deep-flatten":   "",
	"journaling":     "exclusive-lock",
}

var (
	prefixRe  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$`)
	numericRe = regexp.MustCompile(`^[1-9][0-9]{0,9}$`)
)

// volumeOptions is what a volume's parameters decide: where its image is
// and how it is made and mapped.
type volumeOptions struct {
	loc          location
	dataPool     string
	features     string
	prefix       string
	mounter      string // krbd, rbd-nbd or rbd-fuse
	mapOptions   string // ceph-csi's form: "krbd:a,b;nbd:c" or "a,b"
	unmapOptions string
	striping     ceph.ImageOptions // the stripe unit, stripe count and object size asked for
}

// volumeOptionsOf reads the parameters of a CreateVolume (those the driver
// does not keep), with the instance's config for what they leave out: its
// own cluster, its pool, its image features and mounter. Nothing is asked
// of the cluster; the cluster map is read for the cluster ID and its
// namespace.
func (s *Store) volumeOptionsOf(params map[string]string) (volumeOptions, error) {
	o := volumeOptions{
		loc:      location{cluster: s.cfg.ClusterID, pool: s.cfg.Pool},
		features: s.cfg.ImageFeatures,
		prefix:   volumePrefix,
		mounter:  s.cfg.Mounter,
	}
	for _, k := range slices.Sorted(maps.Keys(params)) {
		v := params[k]
		if backend.DriverParameter(k) {
			continue // the driver's: mkfsOptions, csi.storage.k8s.io/*
		}
		bad := func(format string, args ...any) error {
			return errdefs.InvalidArgument("parameters.%s %q: %s", k, v, fmt.Sprintf(format, args...))
		}
		switch k {
		case ParamClusterID:
			if !clusterIDRe.MatchString(v) {
				return o, bad("not a cluster ID (1-64 letters, digits, '.', '_', '-')")
			}
			if known, err := s.c.knowsCluster(v); err != nil {
				return o, err
			} else if !known {
				return o, bad("this rbd backend (%s) serves cluster %s and the clusters of its cluster map%s, not this one", s.key, s.cfg.ClusterID, mapName(s.cfg.ClusterMap))
			}
			o.loc.cluster = v
		case ParamPool:
			if !poolRe.MatchString(v) {
				return o, bad("not a pool name (letters, digits, '.', '_', '-')")
			}
			o.loc.pool = v
		case ParamDataPool:
			if !poolRe.MatchString(v) {
				return o, bad("not a pool name (letters, digits, '.', '_', '-')")
			}
			o.dataPool = v
		case ParamRadosNamespace:
			if v != "" && !namespaceRe.MatchString(v) {
				return o, bad("not a RADOS namespace name (letters, digits, '.', '_', '-')")
			}
		case ParamImageFeatures:
			o.features = v
		case ParamImageFormat:
			switch v {
			case "2":
			case "1":
				return o, bad("refused: format 1 images cannot be cloned, and Spindle's snapshots and clones are RBD clones (Ceph deprecated format 1)")
			default:
				return o, bad("must be \"2\"")
			}
		case ParamMounter:
			m, ok := mounterNames[v]
			if !ok {
				return o, bad("not a mounter: %s", strings.Join(slices.Sorted(maps.Keys(mounterNames)), ", "))
			}
			o.mounter = m
		case ParamMapOptions:
			if _, err := parseMounterOptions(v); err != nil {
				return o, bad("%v", err)
			}
			o.mapOptions = v
		case ParamUnmapOptions:
			if _, err := parseMounterOptions(v); err != nil {
				return o, bad("%v", err)
			}
			o.unmapOptions = v
		case ParamVolumeNamePrefix:
			if err := checkPrefix(v, snapPrefix); err != nil {
				return o, bad("%v", err)
			}
			o.prefix = v
		case ParamStripeUnit, ParamStripeCount, ParamObjectSize:
			if !numericRe.MatchString(v) {
				return o, bad("must be a positive whole number")
			}
			n, _ := strconv.ParseUint(v, 10, 64)
			switch k {
			case ParamStripeUnit:
				o.striping.StripeUnit = n
			case ParamStripeCount:
				o.striping.StripeCount = n
			default:
				// Ceph's own bounds of an object (orders 12 to 25).
				if n&(n-1) != 0 || n < 4<<10 || n > 32<<20 {
					return o, bad("must be a power of two from 4096 to 33554432 (bytes)")
				}
				o.striping.ObjectSize = n
			}
		case ParamTryOtherMounters:
			switch v {
			case "false":
			case "true":
				return o, bad("refused: Spindle maps a volume with the one mounter it names and does not fall back to another")
			default:
				return o, bad("must be \"true\" or \"false\"")
			}
		default:
			if why, ok := refusedParameters[k]; ok {
				return o, bad("refused: %s", why)
			}
			if slices.Contains(qosParameters, k) {
				return o, bad("refused: Spindle sets no QoS limits on images")
			}
			return o, errdefs.InvalidArgument("parameters: unknown key %q (the rbd backend takes ceph-csi's %s)", k, strings.Join(knownParameters, ", "))
		}
	}
	ns, err := s.namespaceFor(o.loc.cluster, params)
	if err != nil {
		return o, err
	}
	o.loc.namespace = ns
	if err := checkFeatures(o.features, o.mounter); err != nil {
		return o, err
	}
	if o.mounter == MounterFuse && (o.mapOptions != "" || o.unmapOptions != "") {
		return o, errdefs.InvalidArgument("parameters: rbd-fuse takes no map or unmap options; %s and %s are for krbd and rbd-nbd", ParamMapOptions, ParamUnmapOptions)
	}
	if id := o.loc.ref(o.prefix + strings.Repeat("0", 32)).idOf(s.cfg.ClusterID); len(s.key)+1+len(id) > maxVolumeIDLength {
		return o, errdefs.InvalidArgument("parameters: the volume ID %s/%s would be longer than %d bytes (cluster ID, pool, namespace and volumeNamePrefix are all part of it); use shorter names", s.key, id, maxVolumeIDLength)
	}
	return o, nil
}

// maxVolumeIDLength is the longest volume ID the driver accepts
// (volumeid.MaxLength; not imported, the backends know nothing of it
// otherwise).
const maxVolumeIDLength = 128

// knownParameters are the keys volumeOptionsOf takes, for its message.
var knownParameters = []string{ParamClusterID, ParamPool, ParamDataPool, ParamRadosNamespace, ParamImageFeatures, ParamImageFormat,
	ParamMounter, ParamMapOptions, ParamUnmapOptions, ParamVolumeNamePrefix, ParamStripeUnit, ParamStripeCount, ParamObjectSize}

// namespaceFor is the RADOS namespace of a new image in cluster: the
// radosNamespace parameter, else the cluster map's for that cluster.
func (s *Store) namespaceFor(cluster string, params map[string]string) (string, error) {
	if v, ok := params[ParamRadosNamespace]; ok {
		return v, nil
	}
	ep, err := s.c.endpointOf(cluster)
	if err != nil {
		return "", err
	}
	return ep.namespace, nil
}

// mounterNames are the mounter values taken: ceph-csi's ("rbd" and "krbd"
// for the kernel's rbd driver, "rbd-nbd") and Spindle's own rbd-fuse.
var mounterNames = map[string]string{
	"rbd": MounterKRBD, MounterKRBD: MounterKRBD, MounterNBD: MounterNBD, "nbd": MounterNBD, MounterFuse: MounterFuse,
}

// checkFeatures refuses features ceph-csi does not take, ones missing what
// they need, a list without layering (every snapshot and clone is an RBD
// clone, which needs it) and journaling for krbd, which cannot map such
// images.
func checkFeatures(list, mounter string) error {
	features := strings.Split(list, ",")
	for _, f := range features {
		need, ok := featureNeeds[f]
		switch {
		case !ok:
			return errdefs.InvalidArgument("parameters.%s %q: %q is not a feature ceph-csi takes (%s)", ParamImageFeatures, list, f, strings.Join(slices.Sorted(maps.Keys(featureNeeds)), ", "))
		case need != "" && !slices.Contains(features, need):
			return errdefs.InvalidArgument("parameters.%s %q: %s needs %s", ParamImageFeatures, list, f, need)
		}
	}
	if !slices.Contains(features, "layering") {
		return errdefs.InvalidArgument("parameters.%s %q must include layering: Spindle's snapshots and clones are RBD clones, which need it", ParamImageFeatures, list)
	}
	if slices.Contains(features, "journaling") && mounter == MounterKRBD {
		return errdefs.InvalidArgument("parameters.%s %q: krbd cannot map images with journaling; use mounter rbd-nbd", ParamImageFeatures, list)
	}
	return nil
}

// checkPrefix refuses an image name prefix that is not a name's start, or
// one a Spindle image of another kind starts with (other is the prefix of
// the other kind).
func checkPrefix(prefix, other string) error {
	if !prefixRe.MatchString(prefix) {
		return fmt.Errorf("not the start of an image name (1-64 letters, digits, '.', '_', '-')")
	}
	for _, reserved := range []string{tmpPrefix, other} {
		if strings.HasPrefix(prefix, reserved) || strings.HasPrefix(reserved, prefix) {
			return fmt.Errorf("collides with %q, the names Spindle gives its %s", reserved, map[string]string{tmpPrefix: "images being built", snapPrefix: "snapshots", volumePrefix: "volumes"}[reserved])
		}
	}
	return nil
}

// parseMounterOptions reads ceph-csi's per-mounter options,
// "krbd:a,b;nbd:c" (a part without a mounter is krbd's), into options by
// mounter.
func parseMounterOptions(s string) (map[string]string, error) {
	out := map[string]string{}
	if s == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ";") {
		if strings.TrimSpace(part) == "" {
			continue // "krbd:a;" as ceph-csi takes it: an empty item is none
		}
		mounter, opts, found := strings.Cut(part, ":")
		if !found {
			mounter, opts = "krbd", part
		}
		var m string
		switch strings.TrimSpace(mounter) {
		case "", "krbd", "rbd":
			m = MounterKRBD
		case "nbd", MounterNBD:
			m = MounterNBD
		default:
			return nil, fmt.Errorf("%q is not a mounter of ceph-csi's form \"krbd:opt,opt;nbd:opt\"", mounter)
		}
		opts = strings.TrimSpace(opts)
		if !mapOptionsRe.MatchString(opts) {
			return nil, fmt.Errorf("%q may hold only letters, digits and _=,.:-", opts)
		}
		if _, dup := out[m]; dup {
			return nil, fmt.Errorf("names %s twice", m)
		}
		out[m] = opts
	}
	return out, nil
}

// optionsFor picks mounter's options out of ceph-csi's per-mounter form
// (validated when the volume was created).
func optionsFor(s, mounter string) string {
	opts, _ := parseMounterOptions(s)
	return opts[mounter]
}

// snapshotOptions is what a VolumeSnapshotClass's parameters decide.
type snapshotOptions struct {
	prefix string
}

// snapshotOptionsOf reads a CreateSnapshot's parameters for a source in
// source's location: ceph-csi's clusterID (it must be the source's: an
// RBD snapshot lives in its source's cluster) and snapshotNamePrefix.
func (s *Store) snapshotOptionsOf(source ref, params map[string]string) (snapshotOptions, error) {
	o := snapshotOptions{prefix: snapPrefix}
	for _, k := range slices.Sorted(maps.Keys(params)) {
		v := params[k]
		if backend.DriverParameter(k) {
			continue
		}
		switch k {
		case ParamClusterID:
			if v != source.cluster {
				return o, errdefs.InvalidArgument("parameters.%s %q: the source volume is in cluster %s, and a snapshot is taken in its source's cluster", k, v, source.cluster)
			}
		case ParamSnapshotNamePrefix:
			if err := checkPrefix(v, volumePrefix); err != nil {
				return o, errdefs.InvalidArgument("parameters.%s %q: %v", k, v, err)
			}
			o.prefix = v
		default:
			return o, errdefs.InvalidArgument("parameters: unknown key %q (the rbd backend's snapshot parameters are ceph-csi's %s and %s)", k, ParamClusterID, ParamSnapshotNamePrefix)
		}
	}
	return o, nil
}

// Claims implements backend.Parameters: parameters that name no backend
// instance are this instance's when their clusterID is its own cluster or
// one of its cluster map. While its map cannot be read it claims them
// too, so that the request fails on the map's error rather than going to
// another backend that knows no clusterID.
func (s *Store) Claims(params map[string]string) bool {
	id, ok := params[ParamClusterID]
	if !ok {
		return false
	}
	known, err := s.c.knowsCluster(id)
	return known || err != nil
}

// CheckVolumeParameters implements backend.Parameters.
func (s *Store) CheckVolumeParameters(params map[string]string) error {
	_, err := s.volumeOptionsOf(params)
	return err
}

// CheckSnapshotParameters implements backend.Parameters.
func (s *Store) CheckSnapshotParameters(sourceImageID string, params map[string]string) error {
	source, err := s.volumeRef(sourceImageID)
	if err != nil {
		return err
	}
	_, err = s.snapshotOptionsOf(source, params)
	return err
}

var _ backend.Parameters = (*Store)(nil)

// defaultMapOptions are the instance's configured map options when
// mounter is the instance's mounter: they are written for that mounter (a
// krbd option means nothing to rbd-nbd, which refuses it), so a class that
// picks another mounter starts from none.
func (s *Store) defaultMapOptions(mounter string) string {
	if mounter != s.cfg.Mounter {
		return ""
	}
	return s.cfg.MapOptions
}

// mapSettings is how a node maps a volume: its mounter and that mounter's
// map and unmap options, from the publish_context the controller gave
// (which it derived from the volume's record), else the volume's record,
// else the instance's config; a VolumeAttributesClass's mapOptions
// (mutable) replaces the map options.
func (s *Store) mapSettings(img *backend.Image, pc map[string]string) (mounter, mapOpts, unmapOpts string) {
	mounter = s.cfg.Mounter
	if m, ok := mounterNames[img.Parameters[ParamMounter]]; ok {
		mounter = m
	}
	if m, ok := mounterNames[pc[ContextMounter]]; ok {
		mounter = m
	}
	mapOpts = s.defaultMapOptions(mounter)
	if v, ok := img.Parameters[ParamMapOptions]; ok {
		mapOpts = optionsFor(v, mounter)
	}
	if v, ok := pc[ContextMapOptions]; ok {
		mapOpts = v
	}
	if v, ok := img.MutableParameters[MutableParamMapOptions]; ok {
		mapOpts = v
	}
	unmapOpts = optionsFor(img.Parameters[ParamUnmapOptions], mounter)
	if v, ok := pc[ContextUnmapOptions]; ok {
		unmapOpts = v
	}
	return mounter, mapOpts, unmapOpts
}
