//go:build !cgo || !ceph

package ceph

import (
	"context"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// NewDialer is the real Dialer, over librados and librbd: built only with
// cgo and the build tag "ceph" (make build and the driver image set both;
// hack/go-tags.sh prints the tags for this machine's librbd headers). This
// build has no Ceph client, and every Dial says so.
func NewDialer() Dialer { return noLibrados{} }

type noLibrados struct{}

func (noLibrados) Dial(context.Context, Target) (Client, error) {
	return nil, errdefs.Precondition("this spindle binary was built without its Ceph client (librados and librbd): build it with `make build`, or with CGO_ENABLED=1 and -tags \"$(hack/go-tags.sh)\" where librbd-dev is installed")
}
