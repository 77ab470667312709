package rbd

import (
	"context"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// An image ceph-csi encrypted is refused by Adopt, dry run or not, naming
// ceph-csi's image-meta key: adopted as a plain volume its workload would
// get a LUKS header whose key only ceph-csi's KMS has. Nothing is written
// (the script holds no "image-meta set").
func TestAdoptRefusesCephCSIEncryptedImage(t *testing.T) {
	const image = "csi-vol-6b9ffd6d-4f49-4ea2-9e5b-2bb2e3f9fb4a"
	// What ceph-csi leaves on an image besides its encryption state
	// (--setmetadata: the PV and claim it serves).
	const names = `"csi.storage.k8s.io/pv/name":"pvc-6b9ffd6d","csi.storage.k8s.io/pvc/name":"data","csi.storage.k8s.io/pvc/namespace":"apps"`
	tests := []struct {
		name, meta, key string
		dryRun          bool
	}{
		{"encrypted", `{` + names + `,"rbd.csi.ceph.com/encrypted":"encrypted"}`, "rbd.csi.ceph.com/encrypted", false},
		{"encrypted, dry run", `{` + names + `,"rbd.csi.ceph.com/encrypted":"encrypted"}`, "rbd.csi.ceph.com/encrypted", true},
		{"prepared, not yet formatted", `{` + names + `,"rbd.csi.ceph.com/encrypted":"encryptionPrepared"}`, "rbd.csi.ceph.com/encrypted", false},
		{"earlier ceph-csi's hidden key", `{".rbd.csi.ceph.com/encrypted":"encrypted"}`, ".rbd.csi.ceph.com/encrypted", false},
		{"its data key kept by the metadata KMS", `{` + names + `,"rbd.csi.ceph.com/dek":"{\"dek\":\"c2VjcmV0\",\"nonce\":\"abcd\"}"}`, "rbd.csi.ceph.com/dek", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			script := commandtest.New(t,
				commandtest.Expect("rbd", with("info", "kube/"+image, "--format", "json")...).Prints(`{"name":"`+image+`","size":1073741824,"features":["layering"]}`),
				commandtest.Expect("rbd", with("image-meta", "list", "kube/"+image, "--format", "json")...).Prints(tt.meta),
			)
			inst, _ := kernelInstance(t, MounterKRBD, script)
			s := inst.Store.(*Store)
			id, err := s.StaticImage("0001-0001-c-0000000000000001-6b9ffd6d-4f49-4ea2-9e5b-2bb2e3f9fb4a", map[string]string{ParamClusterID: "c", ParamPool: "kube", AttrImageName: image})
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.Adopt(context.Background(), backend.AdoptSpec{ImageID: id, Name: "pvc-adopted", AccessType: backend.AccessMount, FsType: "ext4", DryRun: tt.dryRun})
			if errdefs.KindOf(err) != errdefs.ErrPrecondition || !strings.Contains(err.Error(), "ceph-csi encrypted this image") || !strings.Contains(err.Error(), tt.key) {
				t.Fatalf("Adopt = %v; want a precondition failure naming ceph-csi's encryption and %s", err, tt.key)
			}
			if strings.Contains(err.Error(), "c2VjcmV0") {
				t.Fatalf("the refusal carries the wrapped data key: %v", err)
			}
		})
	}
}
