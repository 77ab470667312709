package driver

import (
	"context"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/controller"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/opsapi"
)

// Adopting an image of another driver (kubectl spindle adopt): the plugin
// moves the claim; the controller side gives the image a volume's records,
// in place (controller.Adopt). This is the endpoint's translation.

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
	vol, openBy, err := d.ctrl.Adopt(ctx, controller.AdoptRequest{
		Name: r.Name, Handle: r.Handle, Attributes: r.Attributes, Parameters: r.Parameters,
		AccessType: backend.AccessType(r.AccessType), FsType: r.FsType, Secrets: r.Secrets, DryRun: r.DryRun,
	})
	if err != nil {
		return nil, err
	}
	return &opsapi.AdoptedVolume{VolumeID: vol.ID, CapacityBytes: vol.CapacityBytes, VolumeContext: vol.Context, OpenBy: openBy, DryRun: r.DryRun}, nil
}
