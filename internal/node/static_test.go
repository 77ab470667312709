package node

import (
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// The records of pre-provisioned volumes live on the host, where the fake
// sees them, in the layout and JSON older node plugins wrote.
func TestStaticVolumeRecords(t *testing.T) {
	host := NewFakeHost()
	const dir = "/var/lib/kubelet/plugins/spindle.csi.dev/static-volumes"
	v, err := New(host, Options{NodeID: "node-a", PathRoots: []string{"/var/lib/kubelet"}, StaticRecordsDir: dir, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	const handle = "csi-vol-0001"
	// sha256("csi-vol-0001")[:16], hex: the file an older plugin wrote.
	path := dir + "/51468481bea3670d76568c86108a2333.json"
	if sv, err := v.StaticVolume(handle); sv != nil || err != nil {
		t.Fatalf("StaticVolume before any record = %+v, %v; want none", sv, err)
	}
	sv := StaticVolume{Handle: handle, Backend: "rbd/ceph-a", Image: "kube/csi-vol-0001"}
	if err := v.RecordStatic(sv); err != nil {
		t.Fatal(err)
	}
	data, err := host.ReadFile(path)
	if err != nil {
		t.Fatalf("the record is not at %s: %v", path, err)
	}
	if want := `{"handle":"csi-vol-0001","backend":"rbd/ceph-a","image":"kube/csi-vol-0001"}`; string(data) != want {
		t.Fatalf("record = %s, want %s", data, want)
	}
	if got, err := v.StaticVolume(handle); err != nil || got == nil || *got != sv {
		t.Fatalf("StaticVolume = %+v, %v; want %+v", got, err, sv)
	}
	// A file there that is not this handle's record is none.
	for _, junk := range []string{`{"handle":"other","backend":"rbd/ceph-a","image":"x"}`, `{torn`} {
		host.WriteEntry(path, 0, []byte(junk))
		if got, err := v.StaticVolume(handle); got != nil || err != nil {
			t.Fatalf("StaticVolume with %s there = %+v, %v; want none", junk, got, err)
		}
	}
	if err := v.ForgetStatic(handle); err != nil {
		t.Fatal(err)
	}
	if host.Exists(path) {
		t.Fatal("ForgetStatic left the record")
	}
	if err := v.ForgetStatic(handle); err != nil {
		t.Fatalf("ForgetStatic without a record: %v", err)
	}

	// A node plugin without the directory keeps no record, and says so.
	none, err := New(host, Options{NodeID: "node-a", PathRoots: []string{"/var/lib/kubelet"}})
	if err != nil {
		t.Fatal(err)
	}
	wantKind(t, none.RecordStatic(sv), errdefs.ErrPrecondition, "no directory")
}
