package node

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Options configure Volumes.
type Options struct {
	// NodeID is this node's ID, as the controller granted access to it.
	NodeID string
	// PathRoots confine every path a request names (PathGuard).
	PathRoots []string
	// StageRecordsRoot is where kubelet's staging paths, and so the stage
	// records, are (the inventory and the start-up clean-up look there);
	// "" when unknown.
	StageRecordsRoot string
	// StaticRecordsDir is where the node keeps its records of the
	// pre-provisioned volumes it stages (static.go); "" when it keeps none.
	StaticRecordsDir string
	// OwnerOf names the volume a device belongs to, for refusals that say
	// whose a path is; it returns "" when no backend claims the device.
	OwnerOf func(ctx context.Context, device string) string
	// ObserveFormat hears of every mkfs run (metrics); may be nil.
	ObserveFormat func(fsType string, err error)
	Log           *zap.Logger
}

// Volumes owns the node side of every volume: stage (attach, format once,
// mount, and undo all of it on failure), publish, unpublish, unstage,
// expand, stats and health, each acting only on what Locate proves is the
// named volume's. Everything it touches on the machine goes through Host.
type Volumes struct {
	host  Host
	opts  Options
	guard *PathGuard
	log   *zap.Logger
}

// New returns the node side over host.
func New(host Host, opts Options) (*Volumes, error) {
	guard, err := NewPathGuard(opts.PathRoots...)
	if err != nil {
		return nil, err
	}
	log := opts.Log
	if log == nil {
		log = zap.NewNop()
	}
	return &Volumes{host: host, opts: opts, guard: guard, log: log}, nil
}

// Confine confines a request's path to the node plugin's roots (see
// PathGuard.Confine); the path it returns is the one every later step uses.
func (v *Volumes) Confine(field, path string) (string, error) { return v.guard.Confine(field, path) }

// StageRequest is a validated NodeStageVolume.
type StageRequest struct {
	Volume
	StagingPath string // confined
	Access      backend.AccessType
	Mode        backend.AccessMode
	FsType      string // "" leaves it to the image's record or the default
	MountFlags  []string
	// ReadOnly is the controller's grant (publish_context).
	ReadOnly       bool
	MkfsOptions    []string
	PublishContext map[string]string
	// Encryption, when set, puts the volume's data under dm-crypt (LUKS2).
	Encryption *Encryption
}

const (
	stagingField = "staging_target_path"
	targetField  = "target_path"
)

// Stage brings the volume to its staged state at r.StagingPath: attached,
// and for a filesystem volume formatted once and mounted there. A stage
// that fails undoes what it did: kubelet does not unstage after a failed
// stage, so nothing else would.
func (v *Volumes) Stage(ctx context.Context, r StageRequest) error {
	if err := checkStagingPath(v.host, stagingField, r.StagingPath); err != nil {
		return err
	}
	p, err := v.Locate(ctx, r.Volume, r.StagingPath)
	if err != nil {
		return err
	}
	if p.Info.Dead {
		if err := v.clearDeadMount(ctx, stagingField, p, r.Volume); err != nil {
			return err
		}
		if p, err = v.Locate(ctx, r.Volume, r.StagingPath); err != nil {
			return err
		}
	}
	if staged, err := stagedAsAsked(p, r); staged || err != nil {
		return err
	}
	if p.Info.MountRoot || (p.Owner != "" && !p.Mine) {
		return refuseForeign(stagingField, p, r.Volume)
	}
	// Nothing is attached yet: a staging directory that holds files is
	// refused untouched.
	if r.Access == backend.AccessMount {
		err = prepareMountPoint(v.host, stagingField, r.StagingPath)
	} else {
		err = checkEmptyStagingPath(v.host, stagingField, r.StagingPath)
	}
	if err != nil {
		return err
	}
	var keys [][]byte
	if r.Encryption != nil {
		// Before anything is attached: a node that cannot decrypt, or a
		// KMS that does not answer, leaves nothing to undo.
		if keys, err = v.encryptionKeys(ctx, r); err != nil {
			return err
		}
		defer clearKeys(keys)
	}
	attached, err := r.Attacher.Devices(ctx, r.Image)
	if err != nil {
		return err
	}
	if r.Access == backend.AccessMount {
		if err := v.refuseStagedElsewhere(r.Volume, attached); err != nil {
			return err
		}
	}
	dev, err := r.Attacher.Attach(ctx, backend.AttachRequest{
		ImageID: r.Image, NodeID: v.opts.NodeID, PublishContext: r.PublishContext, ReadOnly: r.ReadOnly || r.Mode.ReadOnly(),
	})
	if err != nil {
		return err
	}
	// A device that was attached before this stage is not this stage's
	// to take away when it fails, nor a mapping that was open before.
	undo := stageUndo{vol: r.Volume, staging: r.StagingPath, device: dev.Path, top: dev.Path,
		keepAttached: slices.ContainsFunc(attached, func(d backend.Device) bool { return d.Path == dev.Path })}
	if dev.AccessType != "" && dev.AccessType != r.Access {
		v.rollbackStage(undo)
		return errdefs.InvalidArgument("volume %s was created for %s access, not %s; staging it as %s could overwrite its data", r.ID, dev.AccessType, r.Access, r.Access)
	}
	var crypt *CryptMapping
	if r.Encryption != nil {
		var opened bool
		crypt, opened, err = v.openEncrypted(ctx, r, dev, keys)
		if err != nil {
			v.rollbackStage(undo)
			return err
		}
		undo.top = crypt.Path
		if opened {
			undo.cryptName = crypt.Name
		}
	}
	if r.Access == backend.AccessBlock {
		err = v.stageBlock(r, dev, crypt, p.Record)
	} else {
		err = v.stageFilesystem(ctx, r, dev, crypt, p.Record)
	}
	if err != nil {
		v.rollbackStage(undo)
		return err
	}
	return nil
}

// stagedAsAsked reports whether p already is the volume staged as r asks
// (a retried NodeStageVolume), refusing a stage of another kind.
func stagedAsAsked(p *Place, r StageRequest) (bool, error) {
	if !p.Mine || !p.Attached {
		return false, nil
	}
	switch {
	case p.Filesystem() && r.Access == backend.AccessBlock:
		return false, errdefs.Precondition("volume %s is staged at %s as a filesystem, not for block access", r.ID, p.Path)
	case p.Filesystem():
		if r.FsType != "" && p.Info.FsType != "" && p.Info.FsType != r.FsType {
			return false, errdefs.AlreadyExists("volume %s is staged at %s as %s, not %s", r.ID, p.Path, p.Info.FsType, r.FsType)
		}
		return true, nil
	case p.Record != nil && p.Record.AccessType == string(backend.AccessBlock) && !p.Info.MountRoot:
		if r.Access != backend.AccessBlock {
			return false, errdefs.Precondition("volume %s is staged at %s for block access, not as a filesystem", r.ID, p.Path)
		}
		return true, nil
	}
	return false, nil
}

// refuseStagedElsewhere refuses to stage a filesystem volume whose device
// is in use on this node. A mount of it is the volume staged at another
// path (a volume is staged at one path per node), and stays refused; a
// device mounted nowhere is held by a process (heldOpen). Only then is the
// mount table read, to say which.
func (v *Volumes) refuseStagedElsewhere(vol Volume, attached []backend.Device) error {
	for _, d := range attached {
		held, err := v.heldDevice(vol, d.Path)
		if err != nil {
			return err
		}
		if held == "" {
			continue
		}
		where, err := v.mountOfDevice(held)
		if err != nil {
			return err
		}
		if where == "" {
			return v.heldOpen(vol, held)
		}
		return errdefs.Precondition("volume %s is already staged on this node at %s (its device %s is mounted there); a volume is staged at one path per node", vol.ID, where, held)
	}
	return nil
}

// heldOpen is the answer to a request that finds the volume's device dev
// in use but mounted nowhere: a process holds it open exclusively, most
// often the mkfs (or e2fsck) of a stage whose node plugin was killed, which
// carries on without it. That passes, so the answer is ErrBusy (ABORTED),
// naming the process where /proc shows it: kubelet's retry succeeds once
// it has exited.
func (v *Volumes) heldOpen(vol Volume, dev string) error {
	openers, err := v.host.DeviceOpeners(dev)
	if err != nil {
		v.log.Warn("cannot tell which process holds a device", zap.String("volumeID", vol.ID), zap.String("device", dev), zap.Error(err))
	}
	if len(openers) == 0 {
		return errdefs.Busy("volume %s is not staged on this node, but its device %s is in use: it is mounted nowhere here, and no process this node plugin can see holds it open (a process or a mount of another namespace?); a retry succeeds once it is let go", vol.ID, dev)
	}
	names := make([]string, 0, len(openers))
	for _, o := range openers {
		names = append(names, o.String())
	}
	return errdefs.Busy("volume %s is not staged on this node, but its device %s is held open by another process, %s, and mounted nowhere (a mkfs left running by a node plugin that was stopped looks like this); a retry succeeds once it exits", vol.ID, dev, strings.Join(names, ", "))
}

// mountOfDevice finds a mount point of the filesystem on dev in the mount
// table, or "".
func (v *Volumes) mountOfDevice(dev string) (string, error) {
	mounts, err := v.host.Mounts()
	if err != nil {
		return "", err
	}
	info, err := v.host.Stat(dev)
	if err != nil {
		return "", err
	}
	for i := range mounts {
		if mounts[i].IsMountOf(dev, info.Rdev.Major, info.Rdev.Minor) {
			return mounts[i].MountPoint, nil
		}
	}
	return "", nil
}

// newRecord is the stage record of a stage that starts now, keeping the
// publishes an earlier record of the same volume at the path listed.
func newRecord(r StageRequest, dev *backend.Device, crypt *CryptMapping, previous *StageRecord, fsType string) StageRecord {
	publishes := []string{}
	if previous != nil && previous.VolumeID == r.ID && previous.Publishes != nil {
		publishes = *previous.Publishes
	}
	rec := StageRecord{VolumeID: r.ID, Device: dev.Path, AccessType: string(r.Access), FsType: fsType, ReadOnly: dev.ReadOnly, Publishes: &publishes}
	if crypt != nil {
		rec.CryptName, rec.Mapper = crypt.Name, crypt.Path
	}
	return rec
}

// stageBlock only records the device: publish binds the device itself.
func (v *Volumes) stageBlock(r StageRequest, dev *backend.Device, crypt *CryptMapping, previous *StageRecord) error {
	if err := v.host.MakeDir(filepath.Dir(r.StagingPath)); err != nil {
		return err
	}
	if err := writeStageRecord(v.host, r.StagingPath, newRecord(r, dev, crypt, previous, "")); err != nil {
		return fmt.Errorf("write stage record: %w", err)
	}
	return nil
}

// stageFilesystem formats the device (an encrypted volume's dm-crypt
// mapping) once, never a device that holds anything, and mounts it at the
// staging path.
func (v *Volumes) stageFilesystem(ctx context.Context, r StageRequest, dev *backend.Device, crypt *CryptMapping, previous *StageRecord) error {
	fsName := r.FsType
	if fsName == "" {
		fsName = dev.FsType
	}
	if fsName == "" {
		fsName = blockdev.DefaultFsType
	}
	fs, err := blockdev.LookupFilesystem(fsName)
	if err != nil {
		return err
	}
	if err := writeStageRecord(v.host, r.StagingPath, newRecord(r, dev, crypt, previous, fs.Name)); err != nil {
		return fmt.Errorf("write stage record: %w", err)
	}
	top := dev.Path
	if crypt != nil {
		top = crypt.Path
	}
	formatted, err := stageFilesystem(ctx, v.observed(), FormatRequest{
		Device:           top,
		Filesystem:       fs,
		MkfsOptions:      r.MkfsOptions,
		AlreadyFormatted: dev.Formatted,
		ReadOnly:         dev.ReadOnly,
	}, r.StagingPath, fs.MountOptions(r.MountFlags, dev.ReadOnly), func(ctx context.Context) error {
		return r.Attacher.RecordFormatted(ctx, r.Image, fs.Name)
	})
	if formatted {
		v.log.Info("formatted volume", zap.String("volumeID", r.ID), zap.String("device", top), zap.String("fsType", fs.Name))
	}
	if err != nil {
		return fmt.Errorf("volume %s: %w", r.ID, err)
	}
	return nil
}

// observed is the host with every mkfs reported to Options.ObserveFormat.
func (v *Volumes) observed() Host {
	if v.opts.ObserveFormat == nil {
		return v.host
	}
	return observedHost{Host: v.host, observe: v.opts.ObserveFormat}
}

type observedHost struct {
	Host
	observe func(fsType string, err error)
}

func (o observedHost) Mkfs(ctx context.Context, fs blockdev.Filesystem, options []string, dev string) error {
	err := o.Host.Mkfs(ctx, fs, options, dev)
	o.observe(fs.Name, err)
	return err
}

// stageUndo is what a failing stage built and must take away again.
type stageUndo struct {
	vol     Volume
	staging string
	device  string // the attached device
	top     string // the device the filesystem is on: device, or the mapping
	// cryptName is the dm-crypt mapping this stage opened ("" when none
	// or when it was open before).
	cryptName    string
	keepAttached bool // the device was attached before this stage
}

// rollbackStage undoes a stage that failed part-way: the mount of this
// stage's device at the staging path, the dm-crypt mapping it opened, the
// device unless it was attached before, and the record. Its own failures
// are logged, since the caller's error is the one that matters; if the
// device cannot be detached the record stays, so that an unstage can
// still find it.
func (v *Volumes) rollbackStage(u stageUndo) {
	ctx := context.Background()
	if info, err := v.host.Stat(u.staging); err == nil && info.MountRoot && v.host.DevicePath(info.Source) == u.top {
		if err := v.host.Unmount(ctx, u.staging); err != nil {
			v.log.Error("rollback of a failed stage: unmount", zap.String("volumeID", u.vol.ID), zap.Error(err))
			return
		}
	}
	if u.cryptName != "" {
		if err := v.host.LUKSClose(ctx, u.cryptName); err != nil {
			v.log.Error("rollback of a failed stage: close dm-crypt mapping", zap.String("volumeID", u.vol.ID), zap.String("mapping", u.cryptName), zap.Error(err))
			return
		}
	}
	if !u.keepAttached {
		if err := u.vol.Attacher.Detach(ctx, u.vol.Image, u.device); err != nil {
			v.log.Error("rollback of a failed stage: detach", zap.String("volumeID", u.vol.ID), zap.String("device", u.device), zap.Error(err))
			return
		}
	}
	if rec, err := readStageRecord(v.host, u.staging); err == nil && rec.VolumeID == u.vol.ID {
		if err := removeStageRecord(v.host, u.staging); err != nil {
			v.log.Error("rollback of a failed stage: remove stage record", zap.String("volumeID", u.vol.ID), zap.Error(err))
		}
	}
}

// clearDeadMount unmounts the dead mount at p if it is the volume's, and
// refuses otherwise.
func (v *Volumes) clearDeadMount(ctx context.Context, field string, p *Place, vol Volume) error {
	switch {
	case p.Owner != "" && !p.Mine:
		return refuseForeign(field, p, vol)
	case !p.Mine:
		return errDeadUnknown(field, p.Path)
	}
	v.log.Warn("mount is dead; unmounting it", zap.String("volumeID", vol.ID), zap.String("path", p.Path))
	return v.host.Unmount(ctx, p.Path)
}

// Unstage undoes Stage: the staging mount, the volume's devices, the
// record. It refuses while the volume is still published, and touches
// nothing that is not the volume's.
func (v *Volumes) Unstage(ctx context.Context, vol Volume, staging string) error {
	if err := checkStagingPath(v.host, stagingField, staging); err != nil {
		return err
	}
	p, err := v.Locate(ctx, vol, staging)
	if err != nil {
		return err
	}
	switch {
	case p.Owner != "" && !p.Mine:
		return refuseForeign(stagingField, p, vol)
	case p.Info.Dead && !p.Mine:
		return errDeadUnknown(stagingField, staging)
	case p.Info.MountRoot && !p.Mine:
		return refuseForeign(stagingField, p, vol)
	}
	if p.Mine && !p.Info.Dead {
		pub, err := v.publishedAt(ctx, vol, p)
		if err != nil {
			return err
		}
		if pub != "" {
			return errdefs.Precondition("volume %s is still published at %s; unpublish it before unstaging", vol.ID, pub)
		}
	}
	if p.Record == nil && !p.Info.MountRoot && !p.Info.Dead {
		// Nothing of the volume is here. A device of it that is mounted
		// elsewhere is staged elsewhere: not this unstage's to take away.
		devs, err := vol.Attacher.Devices(ctx, vol.Image)
		if err != nil {
			return err
		}
		for _, d := range devs {
			if held, err := v.heldDevice(vol, d.Path); err != nil {
				return err
			} else if held != "" {
				where, err := v.mountOfDevice(held)
				if err != nil {
					return err
				}
				if where == "" {
					return v.heldOpen(vol, held)
				}
				return errdefs.Precondition("volume %s is not staged at %s, but its device %s is mounted at %s; unpublish and unstage it where it is", vol.ID, staging, held, where)
			}
		}
	}
	if p.Info.MountRoot || p.Info.Dead {
		if err := v.host.Unmount(ctx, staging); err != nil {
			return err
		}
	}
	if err := v.closeCrypt(ctx, vol); err != nil {
		return err
	}
	if err := vol.Attacher.Detach(ctx, vol.Image, ""); err != nil {
		return err
	}
	if p.Record != nil && p.Mine {
		if err := removeStageRecord(v.host, staging); err != nil {
			return fmt.Errorf("remove stage record: %w", err)
		}
	}
	return nil
}

// publishedAt returns a path where the volume staged at p is still
// published, or "". The stage record lists where it was published; a
// record written before the node kept that list sends it to the mount
// table instead.
func (v *Volumes) publishedAt(ctx context.Context, vol Volume, p *Place) (string, error) {
	if p.Record != nil && p.Record.Publishes != nil {
		for _, target := range *p.Record.Publishes {
			live, err := v.publishedHere(ctx, vol, p, target)
			if err != nil || live {
				return target, err
			}
		}
		return "", nil
	}
	return v.publishedInMountTable(ctx, vol, p)
}

// publishedHere reports whether target holds a publish of the volume staged
// at p: a bind of its staging mount, or a bind of one of its devices.
func (v *Volumes) publishedHere(ctx context.Context, vol Volume, p *Place, target string) (bool, error) {
	if target == p.Path {
		return false, nil
	}
	info, err := v.host.Stat(target)
	if err != nil || !info.MountRoot {
		return false, err
	}
	if p.Filesystem() {
		return info.Type == p.Info.Type && info.Dev == p.Info.Dev && info.Ino == p.Info.Ino, nil
	}
	if !info.IsBlockDevice() {
		return false, nil
	}
	dev := v.host.DevicePath(info.Rdev)
	if m, err := v.host.CryptMapping(dev); err != nil {
		return false, err
	} else if m.Found() {
		dev = m.Backing // a bind of the volume's dm-crypt mapping
	}
	mine, _, err := identify(ctx, vol, dev)
	return mine, err
}

// publishedInMountTable is publishedAt for a stage whose record lists no
// publishes: another mount of the staging mount's filesystem, or a bind of
// one of the volume's devices.
func (v *Volumes) publishedInMountTable(ctx context.Context, vol Volume, p *Place) (string, error) {
	mounts, err := v.host.Mounts()
	if err != nil {
		return "", err
	}
	resolved := Resolve(p.Path)
	if p.Filesystem() {
		for i := range mounts {
			m := &mounts[i]
			if m.MountPoint != resolved && uint32(m.Major) == p.Info.Dev.Major && uint32(m.Minor) == p.Info.Dev.Minor {
				return m.MountPoint, nil
			}
		}
		return "", nil
	}
	devs, err := vol.Attacher.Devices(ctx, vol.Image)
	if err != nil {
		return "", err
	}
	for _, d := range devs {
		if binds := v.deviceBinds(mounts, d.Path); len(binds) > 0 {
			return binds[0], nil
		}
	}
	return "", nil
}

// deviceBinds lists the mount points where the device node dev is bound
// (block publishes): the mount's root names the node ("/loop3" under
// devtmpfs, or a container's /dev), and the mount point's device number
// confirms it.
func (v *Volumes) deviceBinds(mounts []Mount, dev string) []string {
	want, err := v.host.Stat(dev)
	if err != nil || !want.IsBlockDevice() {
		return nil
	}
	var out []string
	for i := range mounts {
		if mounts[i].Root != "/"+filepath.Base(dev) {
			continue
		}
		if got, err := v.host.Stat(mounts[i].MountPoint); err == nil && got.IsBlockDevice() && got.Rdev == want.Rdev {
			out = append(out, mounts[i].MountPoint)
		}
	}
	return out
}

// PublishRequest is a validated NodePublishVolume.
type PublishRequest struct {
	Volume
	StagingPath, TargetPath string // confined
	Access                  backend.AccessType
	Mode                    backend.AccessMode
	ReadOnly                bool
	PublishContext          map[string]string
}

// Publish makes the staged volume visible at r.TargetPath: a bind of the
// staging mount, or of the device for a block volume (a read-only block
// publish gets a read-only device of its own).
func (v *Volumes) Publish(ctx context.Context, r PublishRequest) error {
	if err := checkStagingPath(v.host, stagingField, r.StagingPath); err != nil {
		return err
	}
	sp, err := v.Locate(ctx, r.Volume, r.StagingPath)
	if err != nil {
		return err
	}
	if err := stagedFor(sp, r); err != nil {
		return err
	}
	tp, err := v.Locate(ctx, r.Volume, r.TargetPath)
	if err != nil {
		return err
	}
	if tp.Record != nil {
		return errdefs.Precondition("%s %s is the staging path of volume %s, not a target; the node plugin leaves it as it is", targetField, r.TargetPath, tp.Record.VolumeID)
	}
	if tp.Info.Dead {
		if err := v.clearDeadMount(ctx, targetField, tp, r.Volume); err != nil {
			return err
		}
		if tp, err = v.Locate(ctx, r.Volume, r.TargetPath); err != nil {
			return err
		}
	}
	if tp.Info.MountRoot {
		return v.republish(ctx, r, sp, tp)
	}
	if r.Mode == backend.SingleNodeSingleWriter {
		pub, err := v.publishedAt(ctx, r.Volume, sp)
		if err != nil {
			return err
		}
		if pub != "" && pub != r.TargetPath {
			return errdefs.Precondition("volume %s is already published at %s; access mode %s allows one", r.ID, pub, r.Mode)
		}
	}
	if r.Access == backend.AccessBlock {
		// Before anything is attached or recorded: a target that is not
		// an empty file is refused untouched.
		if err := prepareDeviceTarget(v.host, targetField, r.TargetPath); err != nil {
			return err
		}
	} else if err := prepareMountPoint(v.host, targetField, r.TargetPath); err != nil {
		return err
	}
	if err := v.recordPublish(ctx, r.Volume, sp, r.TargetPath); err != nil {
		return err
	}
	if r.Access == backend.AccessBlock {
		return v.bindDevice(ctx, r, sp)
	}
	return v.bind(ctx, r.StagingPath, r.TargetPath, r.ReadOnly)
}

// stagedFor checks that sp is the volume staged for the access r asks.
func stagedFor(sp *Place, r PublishRequest) error {
	notStaged := func(detail string) error {
		return errdefs.Precondition("volume %s is not staged at %s%s; NodeStageVolume first", r.ID, sp.Path, detail)
	}
	switch {
	case sp.Owner != "" && !sp.Mine:
		return notStaged(" (it holds " + sp.Holds() + ")")
	case sp.Info.Dead:
		return notStaged(" (its mount there is dead)")
	case r.Access == backend.AccessMount && sp.Filesystem() && sp.Mine:
		return nil
	case r.Access == backend.AccessMount && sp.Info.MountRoot:
		return notStaged(" (it holds " + sp.Holds() + ")")
	case r.Access == backend.AccessBlock && sp.Mine && sp.Record != nil && sp.Record.AccessType == string(backend.AccessBlock) && !sp.Info.MountRoot:
		if !sp.Attached {
			return errdefs.Precondition("device %s staged for volume %s is no longer attached; stage the volume again", sp.Record.Device, r.ID)
		}
		if sp.Record.CryptName != "" && sp.Crypt == nil {
			return errdefs.Precondition("dm-crypt mapping %s of volume %s is no longer open on %s; stage the volume again", sp.Record.CryptName, r.ID, sp.Record.Device)
		}
		return nil
	}
	return notStaged("")
}

// republish answers a publish to a target that already holds a mount: the
// same publish done before (idempotent; a read-only remount finishes a
// publish that stopped half-way), or a refusal.
func (v *Volumes) republish(ctx context.Context, r PublishRequest, sp, tp *Place) error {
	if r.Access == backend.AccessBlock {
		if !tp.Mine || !tp.DeviceBind() {
			return refuseForeign(targetField, tp, r.Volume)
		}
		if tp.DeviceReadOnly != (r.ReadOnly || sp.DeviceReadOnly) {
			return errdefs.AlreadyExists("volume %s is published at %s with read-only=%t; asked for read-only=%t", r.ID, r.TargetPath, tp.DeviceReadOnly, r.ReadOnly)
		}
		return nil
	}
	sameBind := tp.Mine && tp.Filesystem() && tp.Info.Dev == sp.Info.Dev && tp.Info.Ino == sp.Info.Ino
	if !sameBind {
		return refuseForeign(targetField, tp, r.Volume)
	}
	switch {
	case r.ReadOnly && !tp.Info.ReadOnly:
		// An earlier publish stopped between bind and read-only remount.
		return v.host.RemountReadOnly(ctx, r.TargetPath)
	case !r.ReadOnly && tp.Info.ReadOnly && !sp.Info.ReadOnly:
		return errdefs.AlreadyExists("volume %s is published read-only at %s; asked for read-write", r.ID, r.TargetPath)
	}
	return nil
}

// recordPublish adds target to the stage record's publishes before the
// bind, dropping the targets that no longer hold the volume, so the record
// lists at least every live publish.
func (v *Volumes) recordPublish(ctx context.Context, vol Volume, sp *Place, target string) error {
	if sp.Record == nil {
		return nil // staged without a record: nothing to keep up to date
	}
	rec := *sp.Record
	var kept []string
	if rec.Publishes != nil {
		for _, t := range *rec.Publishes {
			if t == target {
				continue
			}
			live, err := v.publishedHere(ctx, vol, sp, t)
			if err != nil {
				return err
			}
			if live {
				kept = append(kept, t)
			}
		}
	}
	kept = append(kept, target)
	rec.Publishes = &kept
	if err := writeStageRecord(v.host, sp.Path, rec); err != nil {
		return fmt.Errorf("record the publish at %s in the stage record: %w", target, err)
	}
	return nil
}

// bind binds source onto target, never leaving a writable bind where a
// read-only one was asked for.
func (v *Volumes) bind(ctx context.Context, source, target string, readOnly bool) error {
	if err := v.host.BindMount(ctx, source, target, readOnly); err != nil {
		if uerr := v.host.Unmount(ctx, target); uerr != nil {
			err = errors.Join(err, uerr)
		}
		return err
	}
	return nil
}

// bindDevice binds the staged device onto the target; a read-only publish
// of a writable device gets a read-only device of its own, since a
// read-only bind of a device node does not stop writes to the device.
func (v *Volumes) bindDevice(ctx context.Context, r PublishRequest, sp *Place) (err error) {
	source := sp.Device
	if sp.Crypt != nil {
		if r.ReadOnly && !sp.Crypt.ReadOnly {
			return errdefs.InvalidArgument("volume %s is encrypted and staged writable; a read-only block publish of it would need a second read-only dm-crypt mapping, which Spindle does not make: publish it read-write, or stage it read-only", r.ID)
		}
		return v.bind(ctx, sp.Crypt.Path, r.TargetPath, r.ReadOnly)
	}
	if r.ReadOnly && !sp.DeviceReadOnly {
		ro, err := r.Attacher.Attach(ctx, backend.AttachRequest{
			ImageID: r.Image, NodeID: v.opts.NodeID, PublishContext: r.PublishContext, ReadOnly: true,
		})
		if err != nil {
			return err
		}
		source = ro.Path
		defer func() {
			if err != nil {
				if derr := r.Attacher.Detach(context.WithoutCancel(ctx), r.Image, source); derr != nil {
					err = errors.Join(err, derr)
				}
			}
		}()
	}
	return v.bind(ctx, source, r.TargetPath, r.ReadOnly)
}

// Unpublish undoes Publish at target. A target that holds nothing is fine
// (what is left there is removed if the driver could have made it); one
// that holds another volume's mount, a staging path, or a mount that is no
// volume's is refused untouched.
func (v *Volumes) Unpublish(ctx context.Context, vol Volume, target string) error {
	tp, err := v.Locate(ctx, vol, target)
	if err != nil {
		return err
	}
	switch {
	case tp.Record != nil:
		return errdefs.Precondition("%s %s is the staging path of volume %s, not a target; NodeUnstageVolume unstages it, and the node plugin leaves it as it is", targetField, target, tp.Record.VolumeID)
	case (tp.Info.MountRoot || tp.Info.Dead) && !tp.Mine:
		if tp.Info.Dead && tp.Owner == "" {
			return errDeadUnknown(targetField, target)
		}
		return refuseForeign(targetField, tp, vol)
	}
	if tp.Info.MountRoot || tp.Info.Dead {
		if err := v.host.Unmount(ctx, target); err != nil {
			return err
		}
	}
	if err := removeMountPoint(v.host, targetField, target); err != nil {
		return err
	}
	if tp.DeviceBind() && tp.DeviceReadOnly {
		return v.releaseReadOnlyViews(ctx, vol)
	}
	return nil
}

// releaseReadOnlyViews detaches the read-only devices bindDevice made for
// read-only publishes once no publish uses them. The staged device is the
// writable one and stays. Only an unpublish of a read-only block publish
// gets here, and only it reads the mount table.
func (v *Volumes) releaseReadOnlyViews(ctx context.Context, vol Volume) error {
	devs, err := vol.Attacher.Devices(ctx, vol.Image)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(devs, func(d backend.Device) bool { return !d.ReadOnly }) {
		return nil // the staged device itself is read-only
	}
	mounts, err := v.host.Mounts()
	if err != nil {
		return err
	}
	for _, d := range devs {
		if d.ReadOnly && len(v.deviceBinds(mounts, d.Path)) == 0 {
			if err := vol.Attacher.Detach(ctx, vol.Image, d.Path); err != nil {
				return err
			}
		}
	}
	return nil
}
