package driver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/config"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/kms/kmstest"
	"github.com/spindle-csi/spindle/internal/node"
	"github.com/spindle-csi/spindle/internal/opsapi"
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
	p, err := e.d.ctrl.Unwrap(context.Background(), enc, testSecrets)
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

func (h cryptOfThisKernel) CryptAvailable(ctx context.Context) error {
	return h.linux.CryptAvailable(ctx)
}

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

// postOps sends a JSON POST to the operators' handler and decodes the answer.
func postOps(t *testing.T, h http.Handler, path string, in, out any) int {
	t.Helper()
	body, _ := json.Marshal(in)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
	if rec.Code == http.StatusOK && out != nil {
		if err := json.Unmarshal(rec.Body.Bytes(), out); err != nil {
			t.Fatalf("%s answered %q: %v", path, rec.Body.String(), err)
		}
	} else if rec.Code != http.StatusOK && out != nil {
		if e, ok := out.(*opsapi.Error); ok {
			_ = json.Unmarshal(rec.Body.Bytes(), e)
		}
	}
	return rec.Code
}

// A key rotation through the operators' endpoints, as kubectl-spindle makes
// it, on a staged volume: the header ends up with the next key only, the
// image records it (and the replaced one), and a restage opens with it.
func TestKeyRotationEndpoints(t *testing.T) {
	e := newTestEnv(t)
	h := e.d.OpsHandler()
	resp, err := e.CreateVolume(encryptedCreateReq("pvc-rotate", map[string]string{"encrypted": "true"}))
	if err != nil {
		t.Fatal(err)
	}
	id, vc := resp.GetVolume().GetVolumeId(), resp.GetVolume().GetVolumeContext()
	e.registerNodes(t, defaultKey, testNodeID)
	pc := e.mustPublish(t, id, testNodeID, mountCap("ext4", snw), false)
	stage := e.stageReq(t, id, pc, vc, testSecrets)
	// The records are found below the driver's kubelet directory.
	if err := e.NodeStage(stage); err != nil {
		t.Fatal(err)
	}
	old := e.passphraseOf(t, e.image(t, id).Encryption)
	raw := e.loops[defaultKey].Devices["/dev/loop0"].BackingFile

	var apiErr opsapi.Error
	if code := postOps(t, h, opsapi.PathRotateKey, opsapi.RotateKeyRequest{VolumeID: id, Secrets: map[string]string{"encryptionPassphrase": "not the Secret, 16+ bytes"}}, &apiErr); code != http.StatusPreconditionFailed || !strings.Contains(apiErr.Error, "does not unwrap") {
		t.Fatalf("rotate with another Secret: %d %q", code, apiErr.Error)
	}
	var plan opsapi.KeyRotation
	if code := postOps(t, h, opsapi.PathRotateKey, opsapi.RotateKeyRequest{VolumeID: id, Secrets: testSecrets}, &plan); code != http.StatusOK {
		t.Fatalf("rotate-key: %d", code)
	}
	var again opsapi.KeyRotation
	postOps(t, h, opsapi.PathRotateKey, opsapi.RotateKeyRequest{VolumeID: id, Secrets: testSecrets}, &again)
	if plan.NextWrappedKey == "" || again.NextWrappedKey != plan.NextWrappedKey || plan.WrappedKey != e.image(t, id).Encryption.WrappedKey {
		t.Fatalf("plans %+v, %+v", plan, again)
	}
	next := e.passphraseOf(t, &backend.Encryption{KMSID: plan.KMSID, KeyOwner: plan.KeyOwner, WrappedKey: plan.NextWrappedKey})
	// Committing before the node rekeyed keeps the old key reachable.
	plan.Secrets = testSecrets
	var done opsapi.RotatedKey
	if code := postOps(t, h, opsapi.PathRekey, plan, &done); code != http.StatusOK || done.StagingPath != stage.StagingTargetPath || done.Node != testNodeID {
		t.Fatalf("rekey: %d %+v", code, done)
	}
	keys := e.host.LUKSKeyslots(raw)
	var live [][]byte
	for _, k := range keys {
		if k != nil {
			live = append(live, k)
		}
	}
	if len(live) != 1 || !bytes.Equal(live[0], next) {
		t.Fatalf("live keyslots %q, want the next key only", live)
	}
	if code := postOps(t, h, opsapi.PathCommitKey, opsapi.CommitKeyRequest{VolumeID: id, NextWrappedKey: plan.NextWrappedKey}, nil); code != http.StatusOK {
		t.Fatalf("commit-key: %d", code)
	}
	enc := e.image(t, id).Encryption
	if enc.WrappedKey != plan.NextWrappedKey || enc.NextWrappedKey != "" || enc.PreviousWrappedKey != plan.WrappedKey {
		t.Fatalf("image encryption after commit %+v", enc)
	}
	// A restage with what the controller publishes now opens.
	if err := e.NodeUnstage(&csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage.StagingTargetPath}); err != nil {
		t.Fatal(err)
	}
	if err := e.ControllerUnpublish(id, testNodeID); err != nil {
		t.Fatal(err)
	}
	pc = e.mustPublish(t, id, testNodeID, mountCap("ext4", snw), false)
	if pc["encryptionPreviousWrappedKey"] != plan.WrappedKey {
		t.Fatalf("publish_context %v", pc)
	}
	if err := e.NodeStage(e.stageReq(t, id, pc, vc, testSecrets)); err != nil {
		t.Fatal(err)
	}
	// Not staged on this node: the node says so.
	if err := e.NodeUnstage(&csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage.StagingTargetPath}); err != nil {
		t.Fatal(err)
	}
	apiErr = opsapi.Error{}
	if code := postOps(t, h, opsapi.PathRekey, plan, &apiErr); code != http.StatusNotFound || !strings.Contains(apiErr.Error, "is not staged on node node-a") {
		t.Fatalf("rekey of an unstaged volume: %d %q", code, apiErr.Error)
	}
	for _, entry := range e.logs.All() {
		line := entry.Message + fmt.Sprint(entry.ContextMap())
		if strings.Contains(line, string(old)) || strings.Contains(line, string(next)) || strings.Contains(line, testKEK) {
			t.Fatalf("a log line holds key material: %s", line)
		}
	}
}

// An encrypted volume whose KMS is a real Vault-compatible server (transit
// engine, dev mode, 127.0.0.1): a transit key per volume, made at
// CreateVolume and deleted at DeleteVolume; with the server stopped a stage
// fails UNAVAILABLE naming the KMS, and nothing is attached or formatted.
func TestEncryptedVolumeWithVault(t *testing.T) {
	v := kmstest.StartVault(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(v.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "kms.json")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`{"vault-test": {"encryptionKMSType": "vaulttransit", "vaultAddress": %q, "vaultTokenFile": %q, "vaultTimeout": "5s"}}`, v.Addr, tokenFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newTestEnv(t, func(o *config.Options) { o.KMSConfigFile = cfg })
	params := map[string]string{"encrypted": "true", "encryptionKMSID": "vault-test"}
	keysOf := func(prefix string) []string {
		var out []string
		for _, k := range v.TransitKeys(t) {
			if strings.HasPrefix(k, prefix) {
				out = append(out, k)
			}
		}
		return out
	}
	create := func(name string) (string, map[string]string) {
		req := encryptedCreateReq(name, params)
		req.Secrets = nil // the token is in the configuration
		resp, err := e.CreateVolume(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetVolume().GetVolumeId(), resp.GetVolume().GetVolumeContext()
	}
	id, vc := create("pvc-vault")
	if keys := keysOf("spindle-volume.pvc-vault-"); len(keys) != 1 {
		t.Fatalf("transit keys %v; want one for the volume", v.TransitKeys(t))
	}
	e.registerNodes(t, defaultKey, testNodeID)
	pc := e.mustPublish(t, id, testNodeID, mountCap("ext4", snw), false)
	if !strings.HasPrefix(pc["encryptionWrappedKey"], "vault:v1:") || pc["encryptionKMSID"] != "vault-test" {
		t.Fatalf("publish_context %v", pc)
	}
	stage := e.stageReq(t, id, pc, vc, nil)
	if err := e.NodeStage(stage); err != nil {
		t.Fatal(err)
	}
	if len(e.host.CryptMappings()) != 1 {
		t.Fatalf("mappings %v", e.host.CryptMappings())
	}
	if err := e.NodeUnstage(&csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage.StagingTargetPath}); err != nil {
		t.Fatal(err)
	}
	// Deleting a volume deletes its transit key.
	other, _ := create("pvc-vault-deleted")
	if err := e.DeleteVolume(other); err != nil {
		t.Fatal(err)
	}
	if keys := keysOf("spindle-volume.pvc-vault-deleted-"); len(keys) != 0 {
		t.Fatalf("transit keys after DeleteVolume: %v", keys)
	}
	// The server stopped: the stage fails naming it, before anything is attached.
	v.Stop()
	e.host.Calls = nil
	err := e.NodeStage(stage)
	wantCode(t, err, codes.Unavailable, "kms vault-test (Vault transit at "+v.Addr, "is unreachable")
	t.Logf("with the server stopped, NodeStageVolume answers: %v", err)
	if len(e.loops[defaultKey].Devices) != 0 || len(e.host.Calls) != 0 {
		t.Fatalf("a stage without its KMS attached %v and did %v", e.loops[defaultKey].Devices, e.host.Calls)
	}
}

// unreadableStore is a store whose cluster stops answering reads: Get
// fails, and Delete counts the calls that reach it.
type unreadableStore struct {
	backend.ImageStore
	deletes int
}

func (s *unreadableStore) Get(context.Context, string) (*backend.Image, error) {
	return nil, errdefs.Unavailable("the cluster did not answer")
}

func (s *unreadableStore) Delete(ctx context.Context, imageID string) error {
	s.deletes++
	return s.ImageStore.Delete(ctx, imageID)
}

// DeleteVolume reads the image before it deletes it (an encrypted one's
// key goes first): a read that fails is the answer, with the image and its
// key untouched, and no second call to a cluster that did not answer. A
// plain volume is treated the same: its record could say it is encrypted.
func TestDeleteVolumeAnswersAFailedRead(t *testing.T) {
	for _, params := range []map[string]string{{"encrypted": "true"}, nil} {
		e := newTestEnv(t)
		resp, err := e.CreateVolume(encryptedCreateReq("pvc-unreadable", params))
		if err != nil {
			t.Fatal(err)
		}
		id := resp.GetVolume().GetVolumeId()
		inst := e.d.instances[defaultKey]
		store := inst.Store
		unreadable := &unreadableStore{ImageStore: store}
		inst.Store = unreadable
		wantCode(t, e.DeleteVolume(id), codes.Unavailable, "the cluster did not answer")
		inst.Store = store
		if unreadable.deletes != 0 {
			t.Errorf("encrypted=%q: Delete reached the store %d times after its read failed", params["encrypted"], unreadable.deletes)
		}
		img, err := store.Get(context.Background(), strings.TrimPrefix(id, defaultKey+"/"))
		if err != nil {
			t.Fatalf("encrypted=%q: the image is gone after a failed DeleteVolume: %v", params["encrypted"], err)
		}
		if params != nil && img.Encryption == nil {
			t.Errorf("the image lost its key after a failed DeleteVolume")
		}
		if err := e.DeleteVolume(id); err != nil {
			t.Fatalf("encrypted=%q: DeleteVolume once the store answers: %v", params["encrypted"], err)
		}
		if _, err := store.Get(context.Background(), strings.TrimPrefix(id, defaultKey+"/")); errdefs.KindOf(err) != errdefs.ErrNotFound {
			t.Errorf("encrypted=%q: after DeleteVolume Get says %v, want not found", params["encrypted"], err)
		}
	}
}

// unreadableSnapshots is unreadableStore's counterpart for snapshots.
type unreadableSnapshots struct {
	backend.Snapshotter
	deletes int
}

func (s *unreadableSnapshots) GetSnapshot(context.Context, string) (*backend.Snapshot, error) {
	return nil, errdefs.Unavailable("the cluster did not answer")
}

func (s *unreadableSnapshots) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	s.deletes++
	return s.Snapshotter.DeleteSnapshot(ctx, snapshotID)
}

// DeleteSnapshot, like DeleteVolume, answers a failed read of the snapshot
// with it and its key untouched.
func TestDeleteSnapshotAnswersAFailedRead(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	resp, err := e.CreateVolume(encryptedCreateReq("pvc-snap-unreadable", map[string]string{"encrypted": "true"}))
	if err != nil {
		t.Fatal(err)
	}
	snapResp, err := call(e, "/csi.v1.Controller/CreateSnapshot", e.cs.CreateSnapshot,
		&csi.CreateSnapshotRequest{Name: "snap-unreadable", SourceVolumeId: resp.GetVolume().GetVolumeId(), Secrets: testSecrets})
	if err != nil {
		t.Fatal(err)
	}
	snapID := snapResp.GetSnapshot().GetSnapshotId()
	inst := e.d.instances[defaultKey]
	snaps := inst.Snapshots
	unreadable := &unreadableSnapshots{Snapshotter: snaps}
	inst.Snapshots = unreadable
	_, err = call(e, "/csi.v1.Controller/DeleteSnapshot", e.cs.DeleteSnapshot, &csi.DeleteSnapshotRequest{SnapshotId: snapID})
	inst.Snapshots = snaps
	wantCode(t, err, codes.Unavailable, "the cluster did not answer")
	if unreadable.deletes != 0 {
		t.Errorf("DeleteSnapshot reached the store %d times after its read failed", unreadable.deletes)
	}
	snap, err := snaps.GetSnapshot(ctx, strings.TrimPrefix(snapID, defaultKey+"/"))
	if err != nil || snap.Encryption == nil {
		t.Fatalf("after a failed DeleteSnapshot: snapshot %+v, %v; want it with its key", snap, err)
	}
	if _, err := call(e, "/csi.v1.Controller/DeleteSnapshot", e.cs.DeleteSnapshot, &csi.DeleteSnapshotRequest{SnapshotId: snapID}); err != nil {
		t.Fatalf("DeleteSnapshot once the store answers: %v", err)
	}
	if _, err := snaps.GetSnapshot(ctx, strings.TrimPrefix(snapID, defaultKey+"/")); errdefs.KindOf(err) != errdefs.ErrNotFound {
		t.Errorf("after DeleteSnapshot GetSnapshot says %v, want not found", err)
	}
}
