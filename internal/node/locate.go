package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Volume is one volume as the node handles it: its ID (as records and
// messages name it), its image in the backend, and the backend's node side.
type Volume struct {
	ID       string
	Image    string
	Attacher backend.Attacher
}

// Place is what one path holds, and whose it is. Every node request asks
// Locate first and acts only on what belongs to the volume it names.
type Place struct {
	Path string
	Info PathInfo
	// Record is the stage record beside Path: Path is a staging path.
	Record *StageRecord
	// Device is the block device at Path: the one under the filesystem
	// mounted there, the one bound there, or the one Record names. For an
	// encrypted volume it is the attached device under the dm-crypt
	// mapping, which is Crypt.
	Device string
	// Crypt is the open dm-crypt mapping at Path (the device under the
	// filesystem, the device bound there, or the mapping Record names),
	// or nil.
	Crypt *CryptMapping
	// DeviceReadOnly: Device is attached read-only (known when Mine).
	DeviceReadOnly bool
	// Owner is the volume the path belongs to: the one asked about when
	// its backend proves the device is that volume's image (Mine), another
	// volume when a stage record or a backend says so, "" when nothing of
	// a known volume is there.
	Owner string
	Mine  bool
	// Attached: Device is attached for the volume asked about (for a
	// block stage, whose record is all that is at the path).
	Attached bool
}

// Filesystem reports whether a filesystem is mounted at the path.
func (p *Place) Filesystem() bool {
	return p.Info.MountRoot && !p.Info.Dead && p.Info.Type == os.ModeDir
}

// DeviceBind reports whether a block device node is bound at the path.
func (p *Place) DeviceBind() bool { return p.Info.MountRoot && p.Info.IsBlockDevice() }

// Holds says what is at the path, for a refusal: whose it is when known.
func (p *Place) Holds() string {
	what := p.Info.String()
	switch {
	case p.Info.Dead:
		what = "a dead mount"
	case p.Filesystem():
		what = fmt.Sprintf("a mount of %s", describeFS(p.Info.FsType, p.describeDevice()))
	case p.DeviceBind():
		what = fmt.Sprintf("a bind of device %s", orNumber(p.describeDevice(), p.Info.Rdev))
	case p.Info.MountRoot:
		what = "a mount of " + p.Info.String()
	case p.Record != nil:
		what = "the stage record of a " + p.Record.AccessType + " volume on " + p.Record.Device
	}
	if p.Owner != "" {
		return what + " of volume " + p.Owner
	}
	return what
}

// describeDevice names Device, and the dm-crypt mapping over it.
func (p *Place) describeDevice() string {
	if p.Crypt != nil {
		return fmt.Sprintf("%s (dm-crypt mapping %s of %s)", p.Crypt.Path, p.Crypt.Name, p.Device)
	}
	return p.Device
}

// TopDevice is the device the volume's data is used through: the dm-crypt
// mapping of an encrypted volume, Device otherwise.
func (p *Place) TopDevice() string {
	if p.Crypt != nil {
		return p.Crypt.Path
	}
	return p.Device
}

func describeFS(fsType, dev string) string {
	if fsType == "" {
		fsType = "a filesystem"
	}
	if dev == "" {
		return fsType
	}
	return fsType + " on " + dev
}

func orNumber(dev string, n DevNum) string {
	if dev != "" {
		return dev
	}
	return n.String()
}

// Locate says what is at path and whose it is, from the path itself and the
// record beside it: one stat, one record read and, when a device is there,
// one identity check by the volume's backend. It never reads the mount
// table, except for a dead mount without a record, whose device only the
// mount table still names.
func (v *Volumes) Locate(ctx context.Context, vol Volume, path string) (*Place, error) {
	info, err := v.host.Stat(path)
	if err != nil {
		return nil, err
	}
	p := &Place{Path: path, Info: info}
	rec, err := readStageRecord(v.host, path)
	switch {
	case err == nil && rec.VolumeID != "":
		p.Record = rec
	case err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound:
		return nil, err
	}

	var num DevNum
	switch {
	case p.Info.Dead:
		if p.Record == nil {
			num = v.deadMountDevice(path)
		}
	case p.DeviceBind():
		num = p.Info.Rdev
	case p.Filesystem():
		num = p.Info.Source
	}
	if !num.IsZero() {
		p.Device = v.host.DevicePath(num)
	}
	if p.Device == "" && p.Record != nil && !p.Info.MountRoot {
		p.Device = p.Record.Device
		if p.Record.CryptName != "" {
			// A block stage of an encrypted volume: its mapping, if it
			// is still open on the recorded device.
			m, err := v.host.CryptMappingByName(p.Record.CryptName)
			if err != nil {
				return nil, err
			}
			if m.Found() && m.Backing == p.Device {
				p.Crypt = &m
			}
		}
	} else if p.Device != "" {
		// A mount or bind of a dm-crypt mapping is the volume's whose
		// device the mapping decrypts.
		m, err := v.host.CryptMapping(p.Device)
		if err != nil {
			return nil, err
		}
		if m.Found() {
			p.Crypt, p.Device = &m, m.Backing
		}
	}

	if p.Device != "" && (p.Info.MountRoot || p.Record == nil || p.Record.VolumeID == vol.ID) {
		mine, ro, err := identify(ctx, vol, p.Device)
		if err != nil {
			return nil, err
		}
		if mine {
			p.Owner, p.Mine, p.Attached, p.DeviceReadOnly = vol.ID, true, true, ro
		}
	}
	if !p.Mine {
		switch {
		case p.Record != nil && (p.Record.VolumeID != vol.ID || !p.Info.MountRoot):
			p.Owner = p.Record.VolumeID
			p.Mine = p.Owner == vol.ID
		case p.Device != "" && v.opts.OwnerOf != nil:
			p.Owner = v.opts.OwnerOf(ctx, p.Device)
		}
	}
	return p, nil
}

// identify asks the volume's backend whether dev is its image's device.
func identify(ctx context.Context, vol Volume, dev string) (mine, readOnly bool, err error) {
	d, err := vol.Attacher.Identify(ctx, vol.Image, dev)
	switch {
	case errdefs.KindOf(err) == errdefs.ErrNotFound:
		return false, false, nil
	case err != nil:
		return false, false, fmt.Errorf("volume %s: is %s its device? %w", vol.ID, dev, err)
	}
	return true, d.ReadOnly, nil
}

// deadMountDevice finds in the mount table the device of the dead mount at
// path (stat cannot tell it), or zero.
func (v *Volumes) deadMountDevice(path string) DevNum {
	mounts, err := v.host.Mounts()
	if err != nil {
		return DevNum{}
	}
	m := topMountAt(mounts, filepath.Clean(path))
	if m == nil {
		return DevNum{}
	}
	if m.Major != 0 {
		return DevNum{uint32(m.Major), uint32(m.Minor)}
	}
	// btrfs (an anonymous number): the source names the device.
	if info, err := v.host.Stat(m.Source); err == nil && info.IsBlockDevice() {
		return info.Rdev
	}
	return DevNum{}
}

// refuseForeign is the error for a path that holds something of another
// volume, or a mount that is no volume's: nothing there is touched.
func refuseForeign(field string, p *Place, vol Volume) error {
	return errdefs.Precondition("%s %s holds %s, not volume %s; the node plugin leaves it as it is", field, p.Path, p.Holds(), vol.ID)
}

// errDeadUnknown refuses a dead mount the node cannot tie to any volume.
func errDeadUnknown(field, path string) error {
	return errdefs.Precondition("%s %s is a dead mount that no stage record names and whose device cannot be proven to be a volume's; unmount it by hand", field, path)
}

var errNotStaged = errors.New("not staged")
