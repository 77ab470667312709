package driver

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/opsapi"
)

// Adopting an image of another driver (kubectl spindle adopt). The plugin
// moves the claim; the controller only gives the image a volume's records,
// in place (backend.Adopter): no data moves. The image is found as a
// pre-provisioned volume is (static.go), from the old PV's handle and
// attributes; the parameters are those of the claim's new StorageClass and
// are checked as CreateVolume checks them.

// adoptTimeout bounds one adopt request: a handful of calls to the cluster.
const adoptTimeout = time.Minute

// adopt handles one request.
func (d *Driver) adopt(ctx context.Context, r opsapi.AdoptRequest) (*opsapi.AdoptedVolume, error) {
	if err := validateName("name", r.Name); err != nil {
		return nil, err
	}
	// The operators' endpoint has no authentication of its own: the
	// request must carry the backend's credentials (the StorageClass's
	// provisioner secret), so that only someone who holds them, and could
	// change the image with them anyway, adopts it; the controller's own
	// identity is never lent to it (WithSecretsOnly: secrets that name no
	// complete identity are refused by the backend, not completed with its
	// own).
	if len(r.Secrets) == 0 {
		return nil, errdefs.InvalidArgument("secrets are required: the credentials the image is reached with (kubectl spindle adopt sends the StorageClass's provisioner secret, or --secret)")
	}
	inst, _, image, err := d.staticInstance("handle", r.Handle, r.Attributes)
	if err != nil {
		return nil, err
	}
	adopter, ok := inst.Store.(backend.Adopter)
	if !ok {
		return nil, errdefs.InvalidArgument("backend %s cannot adopt images", inst.Key())
	}
	params, err := d.parseParameters(r.Parameters)
	if err != nil {
		return nil, err
	}
	if params.encrypted {
		return nil, errdefs.InvalidArgument("the StorageClass's parameters.%s is \"true\", but adopt keeps the image's data where it is, in clear: it cannot become an encrypted volume in place; adopt it into a class without %s, or copy its data onto an encrypted volume", paramEncrypted, paramEncrypted)
	}
	if params.instance != inst.Key() {
		return nil, errdefs.InvalidArgument("the image is in backend %s, but the StorageClass parameters pick backend %s", inst.Key(), params.instance)
	}
	spec := backend.AdoptSpec{ImageID: image, Name: r.Name, AccessType: backend.AccessType(r.AccessType), Parameters: params.shaping, DryRun: r.DryRun}
	switch spec.AccessType {
	case backend.AccessMount:
		fsType := r.FsType
		if fsType == "" {
			fsType = params.fsType
		}
		fs, err := blockdev.LookupFilesystem(fsType)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "fsType")
		}
		spec.FsType = fs.Name
	case backend.AccessBlock:
	default:
		return nil, errdefs.InvalidArgument("accessType %q must be mount or block", r.AccessType)
	}
	release, err := d.locks.acquire("adopt/"+inst.Key()+"/"+image, "image "+image)
	if err != nil {
		return nil, err
	}
	defer release()
	res, err := adopter.Adopt(backend.WithSecretsOnly(ctx, r.Secrets), spec)
	if err != nil {
		return nil, err
	}
	vol, err := d.csiVolume(inst, res.Image)
	if err != nil {
		return nil, err
	}
	d.log.Info("adopted an image", zap.String("volumeID", vol.GetVolumeId()), zap.String("name", r.Name), zap.Bool("dryRun", r.DryRun), zap.Strings("openBy", res.OpenBy))
	return &opsapi.AdoptedVolume{VolumeID: vol.GetVolumeId(), CapacityBytes: vol.GetCapacityBytes(), VolumeContext: vol.GetVolumeContext(), OpenBy: res.OpenBy, DryRun: r.DryRun}, nil
}
