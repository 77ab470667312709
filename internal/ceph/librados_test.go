//go:build cgo && ceph

package ceph_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/ceph/cephtest"
)

var (
	cluster       *cephtest.Cluster
	missingReason string
)

func TestMain(m *testing.M) {
	c, err := cephtest.Start(1 << 30)
	if err != nil {
		missingReason = err.Error()
		fmt.Fprintf(os.Stderr, "ceph: the real-cluster contract will fail: %s\n", missingReason)
	} else {
		cluster = c
		fmt.Fprintf(os.Stderr, "ceph: cluster %s up in %s; client %s\n", c.Release, c.StartUp.Round(1e6), c.ClientRelease)
	}
	code := m.Run()
	if c != nil {
		c.Stop()
	}
	os.Exit(code)
}

// The real client (librados, librbd) passes the contract on a real
// cluster of the root's release.
func TestContract(t *testing.T) {
	if cluster == nil {
		t.Fatalf("no Ceph cluster: %s", missingReason)
	}
	dialer := ceph.NewDialer()
	cephtest.Run(t, func(t *testing.T) cephtest.Env { return cluster.Env(dialer) })
}
