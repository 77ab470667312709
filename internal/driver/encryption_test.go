package driver

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/node"
)

// Encrypted volumes through the CSI services: the StorageClass parameters,
// a passphrase per volume wrapped by the built-in secrets KMS and kept with
// the image, the wrapped key handed to the node in publish_context, the
// node opening dm-crypt with it; snapshots and copies keep the same
// passphrase; and no passphrase or Secret in any log line or error.

const testKEK = "the Kubernetes Secret's value, 16+ bytes"

var testSecrets = map[string]string{"encryptionPassphrase": testKEK}

func encryptedCreateReq(name string, params map[string]string) *csi.CreateVolumeRequest {
	req := createReq(name)
	req.CapacityRange = &csi.CapacityRange{RequiredBytes: 64 * mib}
	req.Parameters = params
	req.Secrets = testSecrets
	return req
}

// passphraseOf unwraps e with the driver's KMS, as the node would.
func (e *testEnv) passphraseOf(t *testing.T, enc *backend.Encryption) []byte {
	t.Helper()
	if enc == nil {
		t.Fatal("no encryption recorded")
	}
	p, err := e.d.unwrap(context.Background(), enc, testSecrets)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *testEnv) stageReq(t *testing.T, volumeID string, pc, vc, secrets map[string]string) *csi.NodeStageVolumeRequest {
	return &csi.NodeStageVolumeRequest{
		VolumeId: volumeID, StagingTargetPath: filepath.Join(e.kubelet, "plugins/kubernetes.io/csi/spindle.csi.dev", strings.ReplaceAll(volumeID, "/", "_"), "globalmount"),
		VolumeCapability: mountCap("ext4", snw), PublishContext: pc, VolumeContext: vc, Secrets: secrets,
	}
}

func TestEncryptionParameters(t *testing.T) {
	e := newTestEnv(t)
	for _, tc := range []struct {
		params map[string]string
		want   string
	}{
		{map[string]string{"encrypted": "yes"}, `parameters.encrypted "yes" is not a boolean`},
		{map[string]string{"encryptionKMSID": "secrets"}, `parameters.encryptionKMSID "secrets" is set, but parameters.encrypted is not "true"`},
		{map[string]string{"encrypted": "true", "encryptionKMSID": "vault-x"}, `encryptionKMSID "vault-x" is not configured (configured: secrets)`},
	} {
		_, err := e.CreateVolume(encryptedCreateReq("pvc-bad", tc.params))
		wantCode(t, err, codes.InvalidArgument, tc.want)
	}
	// Without the Secret the built-in KMS cannot wrap: nothing is created.
	req := encryptedCreateReq("pvc-nosecret", map[string]string{"encrypted": "true"})
	req.Secrets = nil
	_, err := e.CreateVolume(req)
	wantCode(t, err, codes.FailedPrecondition, "kms secrets", "carries no secret encryptionPassphrase")
	if imgs := e.poolImages(t, defaultKey); len(imgs) != 0 {
		t.Fatalf("a refused create left %v", imgs)
	}
}

func TestEncryptedVolumeThroughCSI(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	var errs []error
	note := func(err error) error { // every error, for the leak check
		if err != nil {
			errs = append(errs, err)
		}
		return err
	}
	resp, err := e.CreateVolume(encryptedCreateReq("pvc-enc", map[string]string{"encrypted": "true"}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	vc := resp.GetVolume().GetVolumeContext()
	if vc["encrypted"] != "true" || vc["encryptionKMSID"] != "secrets" {
		t.Fatalf("volume context %v", vc)
	}
	img := e.image(t, id)
	if img.Encryption == nil || img.Encryption.KMSID != "secrets" || img.Encryption.KeyOwner != "volume/pvc-enc" {
		t.Fatalf("image encryption %+v", img.Encryption)
	}
	pass := e.passphraseOf(t, img.Encryption)
	// A retried CreateVolume answers the first key.
	if _, err := e.CreateVolume(encryptedCreateReq("pvc-enc", map[string]string{"encrypted": "true"})); err != nil {
		t.Fatal(err)
	}
	if again := e.image(t, id); again.Encryption.WrappedKey != img.Encryption.WrappedKey {
		t.Fatal("a retried CreateVolume changed the volume's key")
	}

	e.registerNodes(t, defaultKey, testNodeID)
	pc := e.mustPublish(t, id, testNodeID, mountCap("ext4", snw), false)
	if pc["encryptionWrappedKey"] != img.Encryption.WrappedKey || pc["encryptionKeyOwner"] != "volume/pvc-enc" || pc["encryptionKMSID"] != "secrets" {
		t.Fatalf("publish_context %v", pc)
	}
	// Without the Secret, or with another one: refused, nothing attached.
	for _, secrets := range []map[string]string{nil, {"encryptionPassphrase": "another Secret of 16+ bytes"}} {
		err := note(e.NodeStage(e.stageReq(t, id, pc, vc, secrets)))
		wantCode(t, err, codes.FailedPrecondition, "kms secrets")
		if len(e.loops[defaultKey].Devices) != 0 || len(e.host.CryptMappings()) != 0 {
			t.Fatalf("a stage without the key attached %v, opened %v", e.loops[defaultKey].Devices, e.host.CryptMappings())
		}
	}
	// Encrypted by its volume context, but no key came with the publish.
	err = note(e.NodeStage(e.stageReq(t, id, map[string]string{}, vc, testSecrets)))
	wantCode(t, err, codes.FailedPrecondition, "publish_context carries no encryptionWrappedKey")

	stage := e.stageReq(t, id, pc, vc, testSecrets)
	if err := e.NodeStage(stage); err != nil {
		t.Fatal(err)
	}
	dev := e.loops[defaultKey].Devices["/dev/loop0"]
	if keys := e.host.LUKSKeyslots(dev.BackingFile); len(keys) != 1 || !bytes.Equal(keys[0], pass) {
		t.Fatalf("the LUKS header's keys %q; want the volume's passphrase", keys)
	}
	if got := e.host.CryptMappings(); len(got) != 1 || got[0] != node.CryptName(id) {
		t.Fatalf("mappings %v", got)
	}
	if err := e.NodeUnstage(&csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage.StagingTargetPath}); err != nil {
		t.Fatal(err)
	}
	if len(e.host.CryptMappings()) != 0 {
		t.Fatalf("after unstage: mappings %v", e.host.CryptMappings())
	}
	if err := e.ControllerUnpublish(id, testNodeID); err != nil {
		t.Fatal(err)
	}

	// A snapshot and what is made of it keep the passphrase, each wrapped
	// for itself.
	snapResp, err := callCtx(ctx, e, "/csi.v1.Controller/CreateSnapshot", e.cs.CreateSnapshot,
		&csi.CreateSnapshotRequest{Name: "snap-enc", SourceVolumeId: id, Secrets: testSecrets})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := e.pools[defaultKey].GetSnapshot(ctx, strings.TrimPrefix(snapResp.GetSnapshot().GetSnapshotId(), defaultKey+"/"))
	if err != nil || snap.Encryption == nil || snap.Encryption.KeyOwner != "snapshot/snap-enc" {
		t.Fatalf("snapshot %+v, %v", snap, err)
	}
	if got := e.passphraseOf(t, snap.Encryption); !bytes.Equal(got, pass) {
		t.Fatal("the snapshot's passphrase is not the volume's")
	}
	restoreReq := encryptedCreateReq("pvc-restored", nil) // its StorageClass says nothing of encryption
	restoreReq.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapResp.GetSnapshot().GetSnapshotId()}}}
	restored, err := e.CreateVolume(restoreReq)
	if err != nil {
		t.Fatal(err)
	}
	rimg := e.image(t, restored.GetVolume().GetVolumeId())
	if rimg.Encryption == nil || rimg.Encryption.KeyOwner != "volume/pvc-restored" || !bytes.Equal(e.passphraseOf(t, rimg.Encryption), pass) {
		t.Fatalf("restored volume's encryption %+v", rimg.Encryption)
	}
	if restored.GetVolume().GetVolumeContext()["encrypted"] != "true" {
		t.Fatalf("restored volume context %v", restored.GetVolume().GetVolumeContext())
	}
	// An unencrypted source cannot become an encrypted volume.
	plain := e.mustCreate(t, createReq("pvc-plain"))
	cloneReq := encryptedCreateReq("pvc-clone", map[string]string{"encrypted": "true"})
	cloneReq.CapacityRange = nil
	cloneReq.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: plain}}}
	_, err = e.CreateVolume(cloneReq)
	wantCode(t, note(err), codes.InvalidArgument, "is not encrypted", "cannot be an encrypted volume")

	if err := e.DeleteVolume(id); err != nil {
		t.Fatal(err)
	}

	// No passphrase and no Secret in any log line or error.
	for _, entry := range e.logs.All() {
		line := entry.Message + fmt.Sprint(entry.ContextMap())
		if strings.Contains(line, string(pass)) || strings.Contains(line, testKEK) {
			t.Fatalf("a log line holds key material: %s", line)
		}
	}
	for _, err := range errs {
		if strings.Contains(err.Error(), string(pass)) || strings.Contains(err.Error(), testKEK) {
			t.Fatalf("an error holds key material: %v", err)
		}
	}
	if len(e.logs.All()) == 0 {
		t.Fatal("no log lines were checked")
	}
}

// cryptOfThisKernel is the in-memory host with this machine's own answer
// to whether dm-crypt is there.
type cryptOfThisKernel struct {
	*node.FakeHost
	linux *node.LinuxHost
}

func (h cryptOfThisKernel) CryptAvailable(ctx context.Context) error { return h.linux.CryptAvailable(ctx) }

// This machine's kernel has no device mapper: NodeStageVolume of an
// encrypted volume answers FAILED_PRECONDITION naming dm_crypt, before
// anything is attached.
func TestEncryptedStageOnThisKernel(t *testing.T) {
	e := newTestEnv(t)
	linux := node.NewLinuxHost(command.New(utilexec.New(), nil))
	if err := linux.CryptAvailable(context.Background()); err == nil {
		t.Skip("this kernel has dm-crypt; the refusal is for kernels without it")
	}
	volumes, err := node.New(cryptOfThisKernel{FakeHost: e.host, linux: linux}, node.Options{NodeID: testNodeID, PathRoots: e.d.opts.PathRoots()})
	if err != nil {
		t.Fatal(err)
	}
	e.d.node = volumes
	resp, err := e.CreateVolume(encryptedCreateReq("pvc-kernel", map[string]string{"encrypted": "true"}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	e.registerNodes(t, defaultKey, testNodeID)
	pc := e.mustPublish(t, id, testNodeID, mountCap("ext4", snw), false)
	err = e.NodeStage(e.stageReq(t, id, pc, resp.GetVolume().GetVolumeContext(), testSecrets))
	wantCode(t, err, codes.FailedPrecondition, "volume "+id+" is encrypted", "dm_crypt")
	t.Logf("NodeStageVolume answers: %v", err)
	if len(e.loops[defaultKey].Devices) != 0 {
		t.Fatalf("attached %v", e.loops[defaultKey].Devices)
	}
}
