package cephfake_test

import (
	"context"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/ceph/cephfake"
	"github.com/spindle-csi/spindle/internal/ceph/cephtest"
)

// The fake passes the contract the real client passes on a real cluster
// (internal/ceph/librados_test.go).
func TestContract(t *testing.T) {
	cephtest.Run(t, func(t *testing.T) cephtest.Env {
		c := cephfake.New("rbd-a", "rbd-b")
		return cephtest.Env{
			Dialer: c.Dialer(), Target: ceph.Target{User: "admin", Key: cephfake.AdminKey, Monitors: []string{"127.0.0.1:3300"}},
			Pool: "rbd-a", OtherPool: "rbd-b", Namespace: "ns1", Admin: admin{c}, Await: time.Second,
		}
	})
}

type admin struct{ c *cephfake.Cluster }

func (a admin) Protect(_ context.Context, s ceph.ImageSpec, snap string) error {
	return a.c.Protect(s, snap)
}

func (a admin) CloneV1(_ context.Context, parent ceph.ImageSpec, snap string, child ceph.ImageSpec) error {
	return a.c.CloneV1(parent, snap, child)
}

func (a admin) Watch(_ context.Context, s ceph.ImageSpec) (string, func(), error) {
	const addr = "10.0.0.9:0/424242"
	stop, err := a.c.Watch(s, addr)
	return addr, stop, err
}

func (a admin) Lock(_ context.Context, s ceph.ImageSpec, cookie string) error {
	return a.c.Lock(s, ceph.Lock{Client: "client.4242", Cookie: cookie, Addr: "10.0.0.9:0/424242"})
}
