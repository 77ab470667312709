package controller

import (
	"maps"
	"strings"
	"unicode"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// StorageClass parameters Spindle understands itself, whatever the
// backend; a backend takes more of its own (backend.Parameters: the rbd
// backend takes ceph-csi's).
const (
	paramBackend     = backend.ParamBackend     // "<type>/<instance>"; the default instance when absent
	paramMkfsOptions = backend.ParamMkfsOptions // extra mkfs arguments, whitespace-separated
	// paramEncrypted and paramEncryptionKMSID ask for an encrypted volume
	// (encryption.go), ceph-csi's names for every backend.
	paramEncrypted       = backend.ParamEncrypted
	paramEncryptionKMSID = backend.ParamEncryptionKMSID
	// Keys with this prefix are added or read by the sidecars
	// (--extra-create-metadata: PVC name, namespace, PV name; the
	// secrets' names); they never change what is created, but for fstype.
	provisionerPrefix = backend.ProvisionerPrefix
	// paramFsType is the external-provisioner's: it takes it from the
	// StorageClass into the volume capability, so it reaches CreateVolume
	// only from a caller that is not the sidecar; it then means the same.
	paramFsType = provisionerPrefix + "fstype"
)

// volumeParameters is the validated parameter map of a CreateVolume.
type volumeParameters struct {
	instance    string            // backend instance key
	mkfsOptions []string          // parsed mkfsOptions
	fsType      string            // csi.storage.k8s.io/fstype, "" when absent
	shaping     map[string]string // the parameters that shape the volume, kept in its metadata
	encrypted   bool              // encrypted: "true"
	kmsID       string            // the KMS that wraps its passphrase (encryption.go)
}

// parseParameters validates a CreateVolume's parameters and picks its
// backend instance: the one "backend" names, else the one whose store
// claims the parameters (a ceph-csi clusterID it serves), else the
// default. Keys the driver does not take go to the instance's store
// (backend.Parameters), which refuses those it does not take either, and
// are kept with the volume.
func (c *Controller) parseParameters(params map[string]string) (volumeParameters, error) {
	vp := volumeParameters{instance: c.def, shaping: map[string]string{}}
	backendKeys := map[string]string{}
	for k, v := range params {
		switch {
		case k == paramBackend:
			if _, ok := c.instances[v]; !ok {
				return volumeParameters{}, errdefs.InvalidArgument("parameters.backend %q is not a configured backend instance (configured: %v)", v, c.instances.Keys())
			}
			vp.instance = v
		case k == paramMkfsOptions:
			opts, err := ParseMkfsOptions(v)
			if err != nil {
				return volumeParameters{}, err
			}
			if len(opts) > 0 {
				vp.mkfsOptions = opts
				vp.shaping[k] = strings.Join(opts, " ")
			}
		case k == paramFsType:
			if v != "" {
				if _, err := blockdev.LookupFilesystem(v); err != nil {
					return volumeParameters{}, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "parameters.%s", k)
				}
			}
			vp.fsType = v
		case k == paramEncrypted, k == paramEncryptionKMSID:
			// The controller's own (encryption.go), whatever the backend: never
			// the store's.
		case isProvisionerKey(k):
		default:
			backendKeys[k] = v
		}
	}
	if err := c.encryptionParameters(&vp, params); err != nil {
		return volumeParameters{}, err
	}
	if _, named := params[paramBackend]; !named {
		inst, err := c.instances.Claiming(params)
		if err != nil {
			return volumeParameters{}, err
		}
		if inst != "" {
			vp.instance = inst
		}
	}
	if len(backendKeys) == 0 {
		return vp, nil
	}
	p, ok := c.instances[vp.instance].Store.(backend.Parameters)
	if !ok {
		for k := range backendKeys {
			return volumeParameters{}, errdefs.InvalidArgument("parameters: unknown key %q (known: %s, %s, %s, %s; backend %s takes no parameters of its own)", k, paramBackend, paramMkfsOptions, paramEncrypted, paramEncryptionKMSID, vp.instance)
		}
	}
	if err := p.CheckVolumeParameters(backendKeys); err != nil {
		return volumeParameters{}, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "backend %s", vp.instance)
	}
	maps.Copy(vp.shaping, backendKeys)
	return vp, nil
}

// snapshotParameters validates a CreateSnapshot's parameters for a source
// volume of inst and returns those its store takes. The sidecar's keys are
// left out; a backend that takes no parameters refuses any other.
func snapshotParameters(inst *backend.Instance, sourceImage string, params map[string]string) (map[string]string, error) {
	own := map[string]string{}
	for k, v := range params {
		if !isProvisionerKey(k) {
			own[k] = v
		}
	}
	if len(own) == 0 {
		return nil, nil
	}
	p, ok := inst.Store.(backend.Parameters)
	if !ok {
		for k := range own {
			return nil, errdefs.InvalidArgument("parameters: unknown key %q (backend %s takes no snapshot parameters)", k, inst.Key())
		}
	}
	if err := p.CheckSnapshotParameters(sourceImage, own); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "backend %s", inst.Key())
	}
	return own, nil
}

// maxMkfsOptions bounds mkfsOptions: they become mkfs's command line.
const maxMkfsOptions = 1024

// ParseMkfsOptions splits mkfsOptions (a StorageClass parameter, and the
// volume context the node stages with) on whitespace, without shell
// quoting, and keeps the device argument Spindle's own: a bare path would
// name a second device for mkfs.
func ParseMkfsOptions(s string) ([]string, error) {
	if len(s) > maxMkfsOptions {
		return nil, errdefs.InvalidArgument("parameters.mkfsOptions is %d bytes long; the maximum is %d", len(s), maxMkfsOptions)
	}
	fields := strings.Fields(s)
	for _, f := range fields {
		if strings.IndexFunc(f, unicode.IsControl) >= 0 {
			return nil, errdefs.InvalidArgument("parameters.mkfsOptions contains a control character")
		}
		if strings.HasPrefix(f, "/") {
			return nil, errdefs.InvalidArgument("parameters.mkfsOptions: %q looks like a device path; only options are allowed", f)
		}
	}
	return fields, nil
}

// isProvisionerKey reports whether a parameter key was added by a sidecar
// (--extra-create-metadata), not by the user: informational, never shaping.
func isProvisionerKey(k string) bool { return strings.HasPrefix(k, provisionerPrefix) }
