package rbd

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Image names. A volume's and a snapshot's image name is derived from its
// CSI name (a hash, so any CSI name fits Ceph's charset and a repeated
// CreateVolume finds the image without a directory); the CSI name itself
// is kept in the image's metadata.
const (
	volumePrefix = "csi-vol-"  // a volume
	snapPrefix   = "csi-snap-" // a CSI snapshot: a copy-on-write clone of its source (cow.go)
	tmpPrefix    = "csi-tmp-"  // an image being built; renamed when complete
	// snapshotSnap is the RBD snapshot of a snapshot image that restored
	// volumes are cloned from (protected on the full copies that earlier
	// versions made).
	snapshotSnap = "csi-snap"
	// cloneSnapPrefix names the short-lived RBD snapshot on a source
	// volume that a clone of it is made from. (Earlier versions kept it,
	// protected, while the clone lived.)
	cloneSnapPrefix = "csi-clone-"
	// copySnapPrefix names the short-lived RBD snapshot on a source volume
	// that a CSI snapshot is cloned from.
	copySnapPrefix = "csi-copy-"
)

// Image metadata keys ("rbd image-meta list" shows them to operators).
const (
	metaName        = "spindle.name"        // the CSI name
	metaVolume      = "spindle.volume"      // JSON volumeRecord
	metaFormatted   = "spindle.formatted"   // the fs type once the node formatted it
	metaMutable     = "spindle.mutable"     // JSON mutable parameters
	metaAttachments = "spindle.attachments" // JSON []backend.Attachment
	metaSnapshot    = "spindle.snapshot"    // JSON snapshotRecord (snapshot images)
	metaDepth       = "spindle.depth"       // copy-on-write parents when made (clones, cow.go)
)

// volumeMetaKeys are the keys a volume image may carry; a copy or clone
// inherits its source's, so a new image sets or removes each of them.
var volumeMetaKeys = []string{metaName, metaVolume, metaFormatted, metaMutable, metaAttachments, metaSnapshot, metaDepth}

// volumeRecord is what a volume image keeps of its CreateVolume request.
type volumeRecord struct {
	AccessType backend.AccessType     `json:"accessType"`
	FsType     string                 `json:"fsType,omitempty"`
	Parameters map[string]string      `json:"parameters,omitempty"`
	Source     *backend.ContentSource `json:"source,omitempty"`
	CreatedAt  time.Time              `json:"createdAt"`
	Encryption *backend.Encryption    `json:"encryption,omitempty"`
}

// snapshotRecord is what a snapshot image keeps.
type snapshotRecord struct {
	SourceImageID string              `json:"sourceImageID"`
	SizeBytes     int64               `json:"sizeBytes"`
	CreatedAt     time.Time           `json:"createdAt"`
	AccessType    backend.AccessType  `json:"accessType"`
	FsType        string              `json:"fsType,omitempty"`
	Formatted     bool                `json:"formatted"`
	Encryption    *backend.Encryption `json:"encryption,omitempty"`
}

// hashedName is prefix + the first 128 bits of SHA-256(csiName) in hex.
func hashedName(prefix, csiName string) string {
	sum := sha256.Sum256([]byte(csiName))
	return prefix + hex.EncodeToString(sum[:16])
}

// Store is the image store of one rbd instance.
type Store struct {
	c   *cluster
	cfg Config
	key string // "rbd/<name>", for messages
	// locks serialise operations on one image name within this process
	// (two CreateVolumes of one name, a Publish racing an Unpublish). The
	// driver's per-volume locks do the same per RPC; the controller runs
	// as one leader-elected replica.
	locks keyedMutex
	// nodes are the nodes registered in this process (see RegisterNode).
	nodesMu sync.Mutex
	nodes   map[string]backend.NodeInfo
	limitMu sync.Mutex // held while counting a limited node's volumes and publishing
	// now is the clock Sweep judges ages by (nil: time.Now); tests set it.
	now func() time.Time
	// bg tracks background work (tasks.go).
	bg background
	// known are the locations this process has images in (locations.go).
	known knownLocations
	// transport is the node side's (attach.go); static volumes use it too.
	transport *transport
}

// ImageID returns the image ID a volume of that CSI name gets without
// parameters (in the instance's pool).
func (s *Store) ImageID(name string) string { return s.cfg.Pool + "/" + hashedName(volumePrefix, name) }

// SnapshotID returns the snapshot ID a snapshot of that CSI name gets of a
// volume in the instance's pool, without parameters.
func (s *Store) SnapshotID(name string) string {
	return s.cfg.Pool + "/" + hashedName(snapPrefix, name)
}

// volumeRef reads a volume's image ID; ErrNotFound when it cannot be one.
func (s *Store) volumeRef(id string) (ref, error) { return parseRef(id, s.cfg.ClusterID, "volume") }

// snapshotRef reads a snapshot's image ID.
func (s *Store) snapshotRef(id string) (ref, error) { return parseRef(id, s.cfg.ClusterID, "snapshot") }

// idOf is the image ID of r.
func (s *Store) idOf(r ref) string { return r.idOf(s.cfg.ClusterID) }

// client is the Ceph client of l's cluster, as the request's identity.
func (s *Store) client(ctx context.Context, l location) (ceph.Client, error) {
	return s.c.client(ctx, l.cluster)
}

// read returns an image's info and metadata.
func (s *Store) read(ctx context.Context, r ref) (*ceph.ImageInfo, map[string]string, error) {
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return nil, nil, err
	}
	return cl.DescribeImage(ctx, r.cephImage())
}

// getImage reads a volume image: its size and metadata, without opening
// it. ErrNotFound names id.
func (s *Store) getImage(ctx context.Context, id string) (*backend.Image, error) {
	r, err := s.volumeRef(id)
	if err != nil {
		return nil, err
	}
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return nil, err
	}
	head, err := cl.ImageHeader(ctx, r.cephImage())
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return nil, errdefs.NotFound("volume %s does not exist", id)
	}
	if err != nil {
		return nil, err
	}
	return s.decode(id, r.image, head.Size, head.Metadata)
}

// describeVolume reads a volume image and what Ceph says of it (its
// features, its parent). ErrNotFound names id.
func (s *Store) describeVolume(ctx context.Context, id string) (*backend.Image, *ceph.ImageInfo, error) {
	r, err := s.volumeRef(id)
	if err != nil {
		return nil, nil, err
	}
	info, meta, err := s.read(ctx, r)
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return nil, nil, errdefs.NotFound("volume %s does not exist", id)
	}
	if err != nil {
		return nil, nil, err
	}
	img, err := s.decode(id, r.image, info.Size, meta)
	return img, info, err
}

// decode builds the backend's view of a volume image.
func (s *Store) decode(id, image string, size uint64, meta map[string]string) (*backend.Image, error) {
	name, ok := meta[metaName]
	if !ok || meta[metaVolume] == "" {
		return nil, errdefs.NotFound("volume %s does not exist (image %s carries no %s metadata)", id, image, metaVolume)
	}
	var rec volumeRecord
	if err := json.Unmarshal([]byte(meta[metaVolume]), &rec); err != nil {
		return nil, fmt.Errorf("image %s: metadata %s: %w", image, metaVolume, err)
	}
	img := &backend.Image{
		ID: id, Name: name, CapacityBytes: int64(size), AccessType: rec.AccessType, FsType: rec.FsType,
		Parameters: rec.Parameters, Source: rec.Source, CreatedAt: rec.CreatedAt, Encryption: rec.Encryption,
	}
	if fs := meta[metaFormatted]; fs != "" {
		img.Formatted, img.FsType = true, fs
	}
	if v := meta[metaMutable]; v != "" {
		if err := json.Unmarshal([]byte(v), &img.MutableParameters); err != nil {
			return nil, fmt.Errorf("image %s: metadata %s: %w", image, metaMutable, err)
		}
	}
	if v := meta[metaAttachments]; v != "" {
		if err := json.Unmarshal([]byte(v), &img.Attachments); err != nil {
			return nil, fmt.Errorf("image %s: metadata %s: %w", image, metaAttachments, err)
		}
	}
	return img, nil
}

// setMeta sets (value != "") or removes (value == "") metadata keys, in
// one call.
func (s *Store) setMeta(ctx context.Context, r ref, kv map[string]string) error {
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return err
	}
	return cl.SetImageMetadata(ctx, r.cephImage(), kv)
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain structs and maps are marshalled
	}
	return string(b)
}

// Get implements backend.ImageStore.
func (s *Store) Get(ctx context.Context, id string) (*backend.Image, error) {
	img, err := s.getImage(ctx, id)
	return img, err
}

// Create implements backend.ImageStore. A volume of no content source is
// made in place (createInPlace). A copy (a clone of a volume, a restore
// of a snapshot) is built under a temporary name (cloned, grown, its
// metadata written) and renamed to its final name last: a clone inherits
// its parent's metadata, so under its final name it would look like a
// volume before it is one; "rbd rename" is atomic and refuses an existing
// name, so a copy is either complete or absent, and a failed Create
// removes its temporary image.
func (s *Store) Create(ctx context.Context, spec backend.VolumeSpec) (*backend.Image, error) {
	if spec.CapacityBytes <= 0 {
		return nil, errdefs.InvalidArgument("volume %q: capacity %d bytes must be positive", spec.Name, spec.CapacityBytes)
	}
	if err := validateMutable(spec.MutableParameters); err != nil {
		return nil, err
	}
	if src := spec.Source; src != nil && (src.ImageID == "") == (src.SnapshotID == "") {
		return nil, errdefs.InvalidArgument("volume %q: a content source names exactly one of a snapshot and a volume, got %+v", spec.Name, *src)
	}
	opts, err := s.volumeOptionsOf(spec.Parameters)
	if err != nil {
		return nil, err
	}
	r := opts.loc.ref(hashedName(opts.prefix, spec.Name))
	id := s.idOf(r)
	defer s.locks.lock(id)()
	if spec.Source == nil {
		return s.createInPlace(ctx, r, spec, opts)
	}

	existing, err := s.getImage(ctx, id)
	// An error of no kind (the monitors did not answer) is that error,
	// never an existing image.
	switch {
	case err == nil:
		return existing, backend.Compatible(existing, spec)
	case errdefs.KindOf(err) == errdefs.ErrNotFound:
	default:
		return nil, err
	}

	rec := volumeRecord{AccessType: spec.AccessType, FsType: spec.FsType, Parameters: spec.Parameters, Source: spec.Source, CreatedAt: time.Now().UTC(), Encryption: spec.Encryption}
	formatted := ""
	var build func(tmp ref) error
	depth := 0                 // copy-on-write parents of the new image
	size := spec.CapacityBytes // the copy's, once grown to the request
	switch {
	case spec.Source.SnapshotID != "":
		snap, err := s.GetSnapshot(ctx, spec.Source.SnapshotID)
		if err != nil {
			return nil, err
		}
		if err := backend.CopyFits(spec, backend.CopySource{SizeBytes: snap.SizeBytes, AccessType: snap.AccessType, FsType: snap.FsType}); err != nil {
			return nil, err
		}
		rec.FsType = snap.FsType
		if snap.Formatted {
			formatted = snap.FsType
		}
		snapImage, _ := s.snapshotRef(snap.ID)
		if err := sameCluster(spec.Name, snapImage, opts.loc); err != nil {
			return nil, err
		}
		parent, parentSnap, d, err := s.restoreSource(ctx, snapImage, fmt.Sprintf("volume %q restored from snapshot %s", spec.Name, snap.ID))
		if err != nil {
			return nil, err
		}
		depth, size = d, max(size, snap.SizeBytes)
		build = func(tmp ref) error {
			return s.clone(ctx, parent, parentSnap, tmp, opts.imageOptions(opts.features), spec.CapacityBytes, snap.SizeBytes)
		}
	default:
		src, srcInfo, err := s.describeVolume(ctx, spec.Source.ImageID)
		if err != nil {
			return nil, err
		}
		if err := backend.CopyFits(spec, backend.CopySource{SizeBytes: src.CapacityBytes, AccessType: src.AccessType, FsType: src.FsType}); err != nil {
			return nil, err
		}
		rec.FsType = src.FsType
		if src.Formatted {
			formatted = src.FsType
		}
		srcRef, _ := s.volumeRef(src.ID)
		if err := sameCluster(spec.Name, srcRef, opts.loc); err != nil {
			return nil, err
		}
		if depth, err = s.admitClone(ctx, srcRef, "", fmt.Sprintf("volume %q cloned from volume %s", spec.Name, src.ID)); err != nil {
			return nil, err
		}
		size = max(size, src.CapacityBytes)
		snap := cloneSnapPrefix + hashOf(r.image)
		build = func(tmp ref) error {
			return s.cloneOfNow(ctx, srcRef, srcInfo, snap, tmp, opts.imageOptions(opts.features), spec.CapacityBytes, false)
		}
	}
	if err := s.checkRoom(ctx, spec.CapacityBytes); err != nil {
		return nil, err
	}
	if err := s.rememberLocation(ctx, r.location); err != nil {
		return nil, err
	}
	meta := volumeMeta(spec, rec, formatted, depth)
	if err := s.buildAndRename(ctx, r, build, meta); err != nil {
		return nil, err
	}
	s.settleDepth(ctx, r, depth)
	return s.decode(id, r.image, uint64(size), meta)
}

// volumeMeta is a new volume image's metadata ("" for a key it must not
// carry).
func volumeMeta(spec backend.VolumeSpec, rec volumeRecord, formatted string, depth int) map[string]string {
	meta := map[string]string{metaName: spec.Name, metaVolume: mustJSON(rec), metaFormatted: formatted, metaDepth: depthValue(depth)}
	if len(spec.MutableParameters) > 0 {
		meta[metaMutable] = mustJSON(spec.MutableParameters)
	}
	return meta
}

// createsObject is the omap object of each location that notes the images
// of a volumeNamePrefix that createInPlace is making, by name, with the
// time it began (RFC 3339): such a name does not say it is Spindle's, and
// Sweep finds a create of one cut short by its note. (One of Spindle's own
// names, csi-vol-<hash>, says so: Sweep finds those by their name.)
const createsObject = "spindle.creates"

// createInPlace makes a volume of no content source under its final name
// in two calls: the image is created, and given its record (one write of
// all its keys). An image of a volume's name without the record is a
// create cut short: nothing ever wrote to it, it was never returned. A
// volumeNamePrefix's image is noted in createsObject first, and the note
// dropped at the end. The image is created before it is looked for:
// CreateImage refuses a name that exists, and only then is the image
// there read (createLeftover).
func (s *Store) createInPlace(ctx context.Context, r ref, spec backend.VolumeSpec, opts volumeOptions) (_ *backend.Image, err error) {
	id := s.idOf(r)
	if err := s.checkRoom(ctx, spec.CapacityBytes); err != nil {
		// A repeated CreateVolume is answered however full the cap is.
		if img, gerr := s.Get(ctx, id); gerr == nil {
			return img, backend.Compatible(img, spec)
		}
		return nil, err
	}
	if err := s.rememberLocation(ctx, r.location); err != nil {
		return nil, err
	}
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return nil, err
	}
	// The note goes unless an image without its record may be left (the
	// cluster failed mid-call): Sweep finds that by the note. A note it
	// cannot drop now is Sweep's to drop.
	noteStays := false
	if !isSpindleImage(r.image) {
		stamp := []byte(s.clock().UTC().Format(time.RFC3339))
		if err := cl.SetOmap(ctx, r.cephPool(), createsObject, map[string][]byte{r.image: stamp}); err != nil {
			return nil, fmt.Errorf("note the create of %s in %s/%s: %w", r.spec(), r.location, createsObject, err)
		}
		defer func() {
			if !noteStays {
				_ = cl.RemoveOmapKeys(context.WithoutCancel(ctx), r.cephPool(), createsObject, []string{r.image})
			}
		}()
	}
	for retried := false; ; retried = true {
		err := cl.CreateImage(ctx, r.cephImage(), uint64(spec.CapacityBytes), opts.imageOptions(opts.features))
		if err == nil {
			break
		}
		if errdefs.KindOf(err) != errdefs.ErrAlreadyExists {
			noteStays = true // a create that timed out may have been made
			return nil, err
		}
		if retried {
			return nil, errdefs.Wrap(errdefs.ErrBusy, err, "image %s was created by another controller meanwhile; retry", r.spec())
		}
		img, err := s.createLeftover(ctx, r, spec)
		if img != nil || err != nil {
			return img, err
		}
	}
	rec := volumeRecord{AccessType: spec.AccessType, FsType: spec.FsType, Parameters: spec.Parameters, CreatedAt: time.Now().UTC(), Encryption: spec.Encryption}
	meta := volumeMeta(spec, rec, "", 0)
	maps.DeleteFunc(meta, func(_, v string) bool { return v == "" })
	if err := s.setMeta(ctx, r, meta); err != nil {
		noteStays = s.removeNow(context.WithoutCancel(ctx), r) != nil
		return nil, err
	}
	return s.decode(id, r.image, uint64(spec.CapacityBytes), meta)
}

// createLeftover reads the image that has the name createInPlace is
// making: the volume (its answer) when it carries a volume record. An
// image of this name without any of Spindle's metadata is a create of
// this very CSI name cut short (the name is a hash of it; earlier versions
// renamed complete volumes into place): it is removed, and (nil, nil) says
// "make it again". One carrying other metadata of Spindle's is not this
// volume.
func (s *Store) createLeftover(ctx context.Context, r ref, spec backend.VolumeSpec) (*backend.Image, error) {
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return nil, err
	}
	head, err := cl.ImageHeader(ctx, r.cephImage())
	switch {
	case errdefs.KindOf(err) == errdefs.ErrNotFound:
		return nil, nil // removed meanwhile
	case err != nil:
		return nil, err
	}
	meta := head.Metadata
	if meta[metaVolume] != "" {
		img, err := s.decode(s.idOf(r), r.image, head.Size, meta)
		if err != nil {
			return nil, err
		}
		return img, backend.Compatible(img, spec)
	}
	if !cutShort(meta) {
		return nil, errdefs.AlreadyExists("volume %q: image %s exists without a volume record, but with Spindle's metadata of another object (%s %q)", spec.Name, r.spec(), metaName, meta[metaName])
	}
	if err := s.removeNow(ctx, r); err != nil {
		return nil, fmt.Errorf("remove %s, a create of volume %q cut short: %w", r.spec(), spec.Name, err)
	}
	return nil, nil
}

// cutShort reports whether an image's metadata is that of an in-place
// create cut short: none of Spindle's keys (its record is written in one
// call).
func cutShort(meta map[string]string) bool {
	for k := range meta {
		if strings.HasPrefix(k, "spindle.") {
			return false
		}
	}
	return true
}

// imageOptions make a new image (or clone) with the volume's features,
// data pool and striping.
func (o volumeOptions) imageOptions(features string) ceph.ImageOptions {
	opts := o.striping
	opts.Features = strings.Split(features, ",")
	opts.DataPool = o.dataPool
	return opts
}

// sameCluster refuses a copy across clusters: an RBD clone is made within
// one cluster (any pool or namespace of it).
func sameCluster(name string, source ref, to location) error {
	if source.cluster != to.cluster {
		return errdefs.InvalidArgument("volume %q would be in cluster %s, but its source %s is in cluster %s: a copy-on-write clone is made within one cluster", name, to.cluster, source.spec(), source.cluster)
	}
	return nil
}

// hashOf is the hash part of a name Spindle gave (prefix + 32 hex digits),
// or the whole name of one it did not.
func hashOf(image string) string {
	if len(image) >= 32 {
		return image[len(image)-32:]
	}
	return image
}

// depthValue is the spindle.depth metadata of a new image ("" for none:
// an image that is no clone).
func depthValue(depth int) string {
	if depth == 0 {
		return ""
	}
	return strconv.Itoa(depth)
}

// buildAndRename runs build on a fresh temporary name in r's location,
// writes meta, removes the keys the copy inherited that meta does not set,
// and renames the result to r. On failure the temporary image is removed.
func (s *Store) buildAndRename(ctx context.Context, r ref, build func(tmp ref) error, meta map[string]string) (err error) {
	tmp := r.location.ref(tmpName(r.image))
	defer func() {
		if err != nil {
			s.removeTemporary(context.WithoutCancel(ctx), tmp)
		}
	}()
	if err := build(tmp); err != nil {
		return err
	}
	all := maps.Clone(meta)
	for _, k := range volumeMetaKeys {
		if _, ok := all[k]; !ok {
			all[k] = ""
		}
	}
	if err := s.setMeta(ctx, tmp, all); err != nil {
		return err
	}
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return err
	}
	if err := cl.RenameImage(ctx, tmp.cephImage(), r.image); err != nil {
		if errdefs.KindOf(err) == errdefs.ErrAlreadyExists {
			return errdefs.Wrap(errdefs.ErrBusy, err, "image %s was created by another controller meanwhile; retry", r.spec())
		}
		return err
	}
	return nil
}

// tmpName is a fresh temporary name for building image.
func tmpName(image string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return tmpPrefix + hashOf(image)[:16] + "-" + hex.EncodeToString(b)
}

// removeTemporary removes a half-built image before the failed call
// answers; what it cannot remove (the cluster is gone) Sweep removes at
// the next controller start, the name says what it is.
func (s *Store) removeTemporary(ctx context.Context, tmp ref) { _ = s.removeNow(ctx, tmp) }

// watchers lists the client addresses that have the image open, but the
// Ceph manager's own (withoutManager).
func (s *Store) watchers(ctx context.Context, r ref) ([]string, error) {
	if err := s.bg.settled(ctx, r.spec()); err != nil {
		return nil, err
	}
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return nil, err
	}
	all, err := cl.Watchers(ctx, r.cephImage())
	if err != nil {
		return nil, err
	}
	return s.withoutManager(ctx, cl, all)
}

// withoutManager drops the Ceph manager's own clients from watchers: its
// rbd_support module opens an image for a moment to run a background task
// (tasks.go), e.g. to detach a removed clone from its parent; that is no
// node writing, must not refuse a delete or a stage, and must never be
// fenced.
func (s *Store) withoutManager(ctx context.Context, cl ceph.Client, watchers []string) ([]string, error) {
	if len(watchers) == 0 {
		return nil, nil
	}
	mgr, err := cl.ManagerClients(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, w := range watchers {
		if !slices.Contains(mgr, w) {
			out = append(out, w)
		}
	}
	return out, nil
}

// Delete implements backend.ImageStore.
func (s *Store) Delete(ctx context.Context, id string) error {
	r, err := s.volumeRef(id)
	if err != nil {
		return nil // no such volume can exist
	}
	defer s.locks.lock(id)()
	in, err := s.inspect(ctx, r)
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return nil
	}
	if err != nil {
		return err
	}
	img, err := s.decode(id, r.image, in.Info.Size, in.Metadata)
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return nil // no volume of Spindle's
	}
	if err != nil {
		return err
	}
	if len(img.Attachments) > 0 {
		var nodes []string
		for _, a := range img.Attachments {
			nodes = append(nodes, strconv.Quote(a.NodeID))
		}
		return errdefs.Precondition("volume %s is still published to node %s; unpublish it first", id, strings.Join(nodes, ", "))
	}
	return s.remove(ctx, r, in)
}

// inspect reads all there is to know of an image before removing it.
func (s *Store) inspect(ctx context.Context, r ref) (*ceph.Inspection, error) {
	// The watchers it lists must be others': this driver's own work
	// after an answer (e.g. dropping a snapshot of it) ends first.
	if err := s.bg.settled(ctx, r.spec()); err != nil {
		return nil, err
	}
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return nil, err
	}
	return cl.InspectImage(ctx, r.cephImage())
}

// listImages lists the names of a location's images.
func (s *Store) listImages(ctx context.Context, l location) ([]string, error) {
	cl, err := s.client(ctx, l)
	if err != nil {
		return nil, err
	}
	return cl.ListImages(ctx, l.cephPool())
}

// List implements backend.ImageStore: the volumes of every location the
// instance has images in (locations.go). An image is a volume when it
// carries a volume record: those named with Spindle's own prefix, and any
// other name (a volumeNamePrefix, an adopted image) whose metadata says so.
func (s *Store) List(ctx context.Context) ([]*backend.Image, error) {
	locs, err := s.locations(ctx)
	if err != nil {
		return nil, err
	}
	var out []*backend.Image
	for _, l := range locs {
		names, err := s.listImages(ctx, l)
		if err != nil {
			return nil, err
		}
		for _, name := range names {
			if strings.HasPrefix(name, snapPrefix) || strings.HasPrefix(name, tmpPrefix) || !imageNameRe.MatchString(name) {
				continue
			}
			img, err := s.getImage(ctx, s.idOf(l.ref(name)))
			if errdefs.KindOf(err) == errdefs.ErrNotFound {
				continue // deleted meanwhile, or not a volume
			}
			if err != nil {
				return nil, err
			}
			out = append(out, img)
		}
	}
	slices.SortFunc(out, func(a, b *backend.Image) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Expand implements backend.ImageStore.
func (s *Store) Expand(ctx context.Context, id string, newBytes int64) (*backend.Image, error) {
	r, err := s.volumeRef(id)
	if err != nil {
		return nil, err
	}
	defer s.locks.lock(id)()
	img, err := s.getImage(ctx, id)
	if err != nil {
		return nil, err
	}
	grow, err := backend.CheckExpand(id, img.CapacityBytes, newBytes)
	if err != nil {
		return nil, err
	}
	if !grow {
		return img, nil
	}
	if err := s.checkRoom(ctx, newBytes-img.CapacityBytes); err != nil {
		return nil, err
	}
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return nil, err
	}
	if err := cl.ResizeImage(ctx, r.cephImage(), uint64(newBytes)); err != nil {
		return nil, err
	}
	img, err = s.getImage(ctx, id)
	return img, err
}

// Modify implements backend.ImageStore.
func (s *Store) Modify(ctx context.Context, id string, mutable map[string]string) (*backend.Image, error) {
	if err := validateMutable(mutable); err != nil {
		return nil, err
	}
	r, err := s.volumeRef(id)
	if err != nil {
		return nil, err
	}
	defer s.locks.lock(id)()
	img, err := s.getImage(ctx, id)
	if err != nil {
		return nil, err
	}
	if len(mutable) == 0 {
		return img, nil
	}
	merged := maps.Clone(img.MutableParameters)
	if merged == nil {
		merged = map[string]string{}
	}
	maps.Copy(merged, mutable)
	if err := s.setMeta(ctx, r, map[string]string{metaMutable: mustJSON(merged)}); err != nil {
		return nil, err
	}
	img.MutableParameters = merged
	return img, nil
}

// MutableParamMapOptions is the one mutable (VolumeAttributesClass)
// parameter of the rbd backend: krbd / rbd-nbd map options for this
// volume, replacing the instance's mapOptions at the next map.
const MutableParamMapOptions = "mapOptions"

func validateMutable(mutable map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(mutable)) {
		switch k {
		case MutableParamMapOptions:
			if !mapOptionsRe.MatchString(mutable[k]) {
				return errdefs.InvalidArgument("mutable parameter %s=%q may hold only letters, digits and _=,.:-", k, mutable[k])
			}
		default:
			return errdefs.InvalidArgument("mutable parameter %q is not supported by the rbd backend (it supports %s)", k, MutableParamMapOptions)
		}
	}
	return nil
}

// provisioned sums the sizes of the instance's images in its own pool
// (volumes, snapshot copies, images being built, by Spindle's names).
func (s *Store) provisioned(ctx context.Context) (int64, error) {
	own := s.ownLocation()
	cl, err := s.client(ctx, own)
	if err != nil {
		return 0, err
	}
	names, err := cl.ListImages(ctx, own.cephPool())
	if err != nil {
		return 0, err
	}
	var n int64
	for _, name := range names {
		if !isSpindleImage(name) {
			continue
		}
		info, err := cl.StatImage(ctx, own.ref(name).cephImage(), "")
		switch {
		case errdefs.KindOf(err) == errdefs.ErrNotFound:
			continue // renamed or removed meanwhile
		case err != nil:
			return 0, err
		}
		n += int64(info.Size)
	}
	return n, nil
}

// checkRoom refuses to provision extra bytes beyond MaxProvisionedBytes.
// RBD images are thin; without a cap the pool's own ENOSPC is the limit.
func (s *Store) checkRoom(ctx context.Context, extra int64) error {
	if s.cfg.MaxProvisionedBytes <= 0 {
		return nil
	}
	n, err := s.provisioned(ctx)
	if err != nil {
		return err
	}
	if n+extra > s.cfg.MaxProvisionedBytes {
		return errdefs.Exhausted("%s has %d of its %d bytes provisioned; %d more do not fit", s.key, n, s.cfg.MaxProvisionedBytes, extra)
	}
	return nil
}

// Capacity implements backend.ImageStore: the pool's max_avail from
// "ceph df", capped by what MaxProvisionedBytes leaves.
func (s *Store) Capacity(ctx context.Context) (backend.Capacity, error) {
	cl, err := s.client(ctx, s.ownLocation())
	if err != nil {
		return backend.Capacity{}, err
	}
	avail, err := cl.PoolAvailable(ctx, s.cfg.Pool)
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return backend.Capacity{}, errdefs.Wrap(errdefs.ErrUnavailable, err, "pool %s of Ceph cluster %s", s.cfg.Pool, s.cfg.ClusterID)
	}
	if err != nil {
		return backend.Capacity{}, err
	}
	if s.cfg.MaxProvisionedBytes > 0 {
		n, err := s.provisioned(ctx)
		if err != nil {
			return backend.Capacity{}, err
		}
		avail = min(avail, max(0, s.cfg.MaxProvisionedBytes-n))
	}
	return backend.Capacity{AvailableBytes: avail, MaximumVolumeBytes: avail}, nil
}

// Probe implements backend.ImageStore: the pool answers.
func (s *Store) Probe(ctx context.Context) error {
	if _, err := s.listImages(ctx, s.ownLocation()); err != nil {
		return errdefs.Wrap(errdefs.ErrUnavailable, err, "pool %s of Ceph cluster %s is not reachable", s.cfg.Pool, s.cfg.ClusterID)
	}
	return nil
}

// keyedMutex is one mutex per key, dropped when unused.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyedEntry
}

type keyedEntry struct {
	mu   sync.Mutex
	refs int
}

// lock locks key and returns the unlock function.
func (k *keyedMutex) lock(key string) func() {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyedEntry{}
	}
	e := k.locks[key]
	if e == nil {
		e = &keyedEntry{}
		k.locks[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

var _ backend.EncryptionKeeper = (*Store)(nil)

// SetEncryption implements backend.EncryptionKeeper: the spindle.volume
// metadata is rewritten with the new Encryption.
func (s *Store) SetEncryption(ctx context.Context, id string, e *backend.Encryption) error {
	r, err := s.volumeRef(id)
	if err != nil {
		return err
	}
	defer s.locks.lock(id)()
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return err
	}
	meta, err := cl.ImageMetadata(ctx, r.cephImage())
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		return errdefs.NotFound("volume %s does not exist", id)
	}
	if err != nil {
		return err
	}
	var rec volumeRecord
	if err := json.Unmarshal([]byte(meta[metaVolume]), &rec); err != nil || meta[metaVolume] == "" {
		return fmt.Errorf("image %s: metadata %s is not a volume record", r.spec(), metaVolume)
	}
	rec.Encryption = e.Clone()
	return s.setMeta(ctx, r, map[string]string{metaVolume: mustJSON(rec)})
}
