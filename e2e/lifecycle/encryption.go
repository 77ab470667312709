package lifecycle

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/internal/kms"
	"github.com/spindle-csi/spindle/internal/node"
	"github.com/spindle-csi/spindle/internal/opsapi"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// Encrypted volumes (StorageClass parameter encrypted: "true") on a real
// kernel with dm-crypt, one backend at a time: RunEncryption is the whole
// set of runs `make vmtest` labels luks-<mode>, the same for every backend.

// EncryptionBackend is what the encrypted-volume runs need of one backend.
type EncryptionBackend struct {
	// Start starts a driver on the backend with o (the runs set Logger and
	// Metrics; Start adds the backend's Config). Every driver it starts
	// serves the same pool, so a second one plays the node plugin after a
	// restart.
	Start func(t *testing.T, o harness.Options) *harness.Driver
	// Secrets go with the node calls besides the KMS's secret (CHAP).
	Secrets map[string]string
	// RawImage returns the volume's image as the backend stores it: what
	// a thief of the pool, the OSDs or the target's disk would read.
	RawImage func(t *testing.T, drv *harness.Driver, volumeID string) []byte
}

// kmsSecret is the Kubernetes Secret the built-in KMS wraps passphrases
// with, sent as the provisioner, snapshotter and node-stage secret.
const kmsSecretKey = kms.DefaultSecretKey

// RequireDMCrypt skips a test on a kernel without dm-crypt, naming it.
func RequireDMCrypt(t testing.TB) {
	t.Helper()
	testutil.RequireRoot(t, "open dm-crypt mappings")
	testutil.RequireCommands(t, "cryptsetup", "dmsetup")
	out, err := exec.Command("dmsetup", "targets").CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("crypt")) {
		_ = exec.Command("modprobe", "dm_crypt").Run()
		if out, err = exec.Command("dmsetup", "targets").CombinedOutput(); err != nil || !bytes.Contains(out, []byte("crypt")) {
			t.Skipf("this kernel has no dm-crypt (kernel modules dm_mod, dm_crypt): dmsetup targets: %v: %s", err, bytes.TrimSpace(out))
		}
	}
}

// payloadOf is data as a Payload.
func payloadOf(data []byte) Payload {
	sum := sha256.Sum256(data)
	return Payload{Data: data, Sha256: hex.EncodeToString(sum[:])}
}

type encRun struct {
	t       *testing.T
	b       EncryptionBackend
	drv     *harness.Driver
	c       *Client
	secrets map[string]string // the KMS's
	log     *bytes.Buffer     // the driver's log, every level
	logMu   *sync.Mutex
	dir     string
}

// syncBuffer is a zap sink the test reads while the driver writes.
type syncBuffer struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (s syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}
func (s syncBuffer) Sync() error { return nil }

func newEncRun(t *testing.T, b EncryptionBackend) *encRun {
	t.Helper()
	r := &encRun{t: t, b: b, log: &bytes.Buffer{}, logMu: &sync.Mutex{}, dir: harness.TempDir(t)}
	secret := make([]byte, 16)
	_, _ = rand.Read(secret)
	r.secrets = map[string]string{kmsSecretKey: "e2e-kek-" + hex.EncodeToString(secret)}
	r.drv = r.start()
	r.c = r.client(r.drv)
	return r
}

// start starts a driver whose every log line lands in r.log.
func (r *encRun) start() *harness.Driver {
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	core := zapcore.NewTee(
		zapcore.NewCore(enc, zapcore.AddSync(syncBuffer{r.logMu, r.log}), zapcore.DebugLevel),
	)
	return r.b.Start(r.t, harness.Options{Logger: zap.New(core), Metrics: true})
}

func (r *encRun) client(drv *harness.Driver) *Client {
	c := NewClient(drv, nil)
	c.Secrets = map[string]string{}
	for k, v := range r.b.Secrets {
		c.Secrets[k] = v
	}
	for k, v := range r.secrets {
		c.Secrets[k] = v
	}
	c.ControllerSecrets = r.secrets
	c.Timeout = 10 * time.Minute // emulated guests
	return c
}

var encryptedParams = map[string]string{"encrypted": "true"}

// volume creates an encrypted volume and removes whatever is left of it
// when the test ends. Its staging path is where kubelet puts one, below
// the driver's kubelet directory, where the node plugin finds its stage
// records (a key rotation asks it where the volume is staged).
func (r *encRun) volume(name string, size int64, vc *csi.VolumeCapability, params map[string]string, source *csi.VolumeContentSource) *Volume {
	r.t.Helper()
	csiDir := filepath.Join(r.drv.KubeletDir, "plugins/kubernetes.io/csi")
	staging := filepath.Join(csiDir, "spindle.csi.dev", name, "globalmount")
	if vc.GetBlock() != nil {
		staging = filepath.Join(csiDir, "volumeDevices/staging", name)
	}
	if err := os.MkdirAll(filepath.Dir(staging), 0o750); err != nil {
		r.t.Fatal(err)
	}
	v, err := r.c.CreateFrom(context.Background(), name, size, vc, params, staging, source)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		ctx := context.Background()
		for _, target := range []string{r.target(v, "a"), r.target(v, "b")} {
			_ = r.c.Unpublish(ctx, v, target)
		}
		_ = r.c.Unstage(ctx, v)
		_ = r.c.ControllerUnpublish(ctx, v)
		if err := r.c.Delete(ctx, v); err != nil {
			r.t.Errorf("delete %s: %v", v.ID, err)
		}
	})
	return v
}

// target is a pod's publish path of v.
func (r *encRun) target(v *Volume, pod string) string {
	t := filepath.Join(r.dir, v.Name, "pod-"+pod)
	_ = os.MkdirAll(filepath.Dir(t), 0o750)
	return t
}

func (r *encRun) must(err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatal(err)
	}
}

// record is v's stage record: its raw device and its mapping.
func (r *encRun) record(v *Volume) *node.StageRecord {
	r.t.Helper()
	rec, err := node.ReadStageRecord(v.StagingPath)
	if err != nil {
		r.t.Fatal(err)
	}
	if rec.CryptName == "" || rec.Mapper == "" {
		r.t.Fatalf("stage record of %s names no dm-crypt mapping: %+v", v.ID, rec)
	}
	return rec
}

// passphrase unwraps v's passphrase as the node does: only tests see it.
func (r *encRun) passphrase(pc map[string]string, key string) []byte {
	r.t.Helper()
	reg, err := kms.NewRegistry(nil)
	r.must(err)
	k, err := reg.Get(pc["encryptionKMSID"])
	r.must(err)
	p, err := k.Unwrap(context.Background(), pc["encryptionKeyOwner"], pc[key], r.secrets)
	r.must(err)
	return p
}

func runOut(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

var luks2Version = regexp.MustCompile(`(?m)^Version:\s+2$`)

// keyslots counts the keyslots of the LUKS header on dev, checking it is LUKS2.
func (r *encRun) keyslots(dev string) int {
	r.t.Helper()
	out, err := runOut("cryptsetup", "luksDump", dev)
	r.must(err)
	if !luks2Version.MatchString(out) {
		r.t.Fatalf("cryptsetup luksDump %s does not show LUKS2:\n%s", dev, out)
	}
	_, slots, _ := strings.Cut(out, "Keyslots:")
	slots, _, _ = strings.Cut(slots, "Tokens:")
	return len(regexp.MustCompile(`(?m)^\s+\d+: luks2`).FindAllString(slots, -1))
}

// testKey reports whether passphrase opens the LUKS header on dev.
func testKey(dev string, passphrase []byte) bool {
	cmd := exec.Command("cryptsetup", "open", "--test-passphrase", "--key-file=-", dev)
	cmd.Stdin = bytes.NewReader(passphrase)
	return cmd.Run() == nil
}

// marker is plaintext written into a volume and looked for on its image.
func newMarker() []byte {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return []byte("SPINDLE-PLAINTEXT-MARKER-" + hex.EncodeToString(b) + "\n")
}

func markerPayload(marker []byte) Payload {
	data := bytes.Repeat(marker, (4<<20)/len(marker))
	return payloadOf(data)
}

// deviceHolds reports whether the device (or file) at path holds needle.
func deviceHolds(t *testing.T, path string, needle []byte) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return readerHolds(t, f, needle)
}

func readerHolds(t *testing.T, rd io.Reader, needle []byte) bool {
	t.Helper()
	buf := make([]byte, 4<<20)
	var tail []byte
	for {
		n, err := io.ReadFull(rd, buf)
		chunk := append(tail, buf[:n]...)
		if bytes.Contains(chunk, needle) {
			return true
		}
		if len(chunk) >= len(needle) {
			tail = append([]byte{}, chunk[len(chunk)-len(needle)+1:]...)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// RunEncryption runs every encrypted-volume check on b.
func RunEncryption(t *testing.T, b EncryptionBackend) {
	RequireDMCrypt(t)
	t.Cleanup(func() { checkNoMappings(t) })
	for _, tc := range []struct {
		name string
		vc   *csi.VolumeCapability
		size int64
	}{
		{"ext4", MountCapability("ext4"), 128 << 20},
		{"xfs", MountCapability("xfs"), 320 << 20},
		{"block", BlockCapability(), 128 << 20},
	} {
		t.Run("lifecycle-"+tc.name, func(t *testing.T) { encLifecycle(t, b, tc.name, tc.vc, tc.size) })
	}
	t.Run("refusals", func(t *testing.T) { encRefusals(t, b) })
	t.Run("expand-online", func(t *testing.T) { encExpand(t, b) })
	t.Run("restage-after-restart", func(t *testing.T) { encRestart(t, b) })
	t.Run("rotation-under-writer", func(t *testing.T) { encRotation(t, b) })
	t.Run("snapshot-restore", func(t *testing.T) { encSnapshot(t, b) })
	t.Run("key-leak", func(t *testing.T) { encKeyLeak(t, b) })
}

// checkNoMappings fails when a dm-crypt mapping of the driver is left.
func checkNoMappings(t *testing.T) {
	names, _ := filepath.Glob("/sys/class/block/dm-*/dm/name")
	for _, n := range names {
		data, _ := os.ReadFile(n)
		if strings.HasPrefix(string(data), "spindle-") {
			t.Errorf("dm-crypt mapping %s is left behind", strings.TrimSpace(string(data)))
		}
	}
}

// The whole life of an encrypted volume: formatted once (LUKS2 header and
// filesystem), data written, no plaintext on the image, restaged (the same
// header and filesystem, opened, not formatted again), read back.
func encLifecycle(t *testing.T, b EncryptionBackend, name string, vc *csi.VolumeCapability, size int64) {
	r := newEncRun(t, b)
	ctx := context.Background()
	v := r.volume("pvc-luks-"+name, size, vc, encryptedParams, nil)
	if v.VolumeContext["encrypted"] != "true" {
		t.Fatalf("volume context %v", v.VolumeContext)
	}
	r.must(r.c.Attach(ctx, v))
	rec := r.record(v)
	if n := r.keyslots(rec.Device); n != 1 {
		t.Fatalf("%d keyslots on a new volume, want 1", n)
	}
	luksUUID, err := runOut("cryptsetup", "luksUUID", rec.Device)
	r.must(err)
	var fsUUID string
	if vc.GetBlock() == nil {
		fsUUID, err = runOut("blkid", "-p", "-s", "UUID", "-o", "value", rec.Mapper)
		r.must(err)
	}
	target := r.target(v, "a")
	r.must(r.c.Publish(ctx, v, target, false))
	marker := newMarker()
	p := markerPayload(marker)
	r.must(Write(v, target, p))
	if !deviceHolds(t, rec.Mapper, marker) {
		t.Fatal("the marker is not on the dm-crypt mapping: the scan cannot see it")
	}
	r.must(r.c.Unpublish(ctx, v, target))
	r.must(r.c.Unstage(ctx, v))
	if _, err := os.Stat(node.MapperPath(rec.CryptName)); !os.IsNotExist(err) {
		t.Fatalf("the mapping %s is still open after unstage: %v", rec.CryptName, err)
	}
	raw := b.RawImage(t, r.drv, v.ID)
	if int64(len(raw)) < size {
		t.Fatalf("the raw image has %d bytes, want %d", len(raw), size)
	}
	if bytes.Contains(raw, marker) {
		t.Fatal("the plaintext marker is on the backend's image")
	}
	if !bytes.Contains(raw[:4096], []byte("LUKS\xba\xbe")) {
		t.Fatal("the image does not start with a LUKS header")
	}
	r.must(r.c.Stage(ctx, v))
	rec = r.record(v)
	if again, _ := runOut("cryptsetup", "luksUUID", rec.Device); again != luksUUID {
		t.Fatalf("LUKS UUID %q after restage, was %q: formatted again", again, luksUUID)
	}
	if fsUUID != "" {
		if again, _ := runOut("blkid", "-p", "-s", "UUID", "-o", "value", rec.Mapper); again != fsUUID {
			t.Fatalf("filesystem UUID %q after restage, was %q", again, fsUUID)
		}
	}
	r.must(r.c.Publish(ctx, v, target, false))
	r.must(Check(v, target, p))
	t.Logf("%s: LUKS2 on %s opened as %s (%s); the %d-byte image holds no plaintext marker", name, rec.Device, node.MapperPath(rec.CryptName), rec.Mapper, len(raw))
}

// withEncryptionOf is pc with the encryption keys of other's.
func withEncryptionOf(pc, other map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range pc {
		if !strings.HasPrefix(k, "encryption") {
			out[k] = v
		}
	}
	for k, v := range other {
		if strings.HasPrefix(k, "encryption") {
			out[k] = v
		}
	}
	return out
}

// A device holding another volume's LUKS header or a plain filesystem is
// refused untouched: never formatted, never opened.
func encRefusals(t *testing.T, b EncryptionBackend) {
	r := newEncRun(t, b)
	ctx := context.Background()
	a := r.volume("pvc-luks-a", 128<<20, MountCapability("ext4"), encryptedParams, nil)
	other := r.volume("pvc-luks-other", 128<<20, MountCapability("ext4"), encryptedParams, nil)
	plain := r.volume("pvc-plain", 128<<20, MountCapability("ext4"), nil, nil)
	for _, v := range []*Volume{a, other, plain} {
		r.must(r.c.Attach(ctx, v)) // formats each once
		r.must(r.c.Unstage(ctx, v))
	}
	for _, tc := range []struct {
		v    *Volume
		want string
	}{
		{other, "does not open the LUKS header"},
		{plain, "holds an ext4 filesystem, not a LUKS header"},
	} {
		before := b.RawImage(t, r.drv, tc.v.ID)[:16<<20]
		staged := *tc.v
		staged.PublishContext = withEncryptionOf(tc.v.PublishContext, a.PublishContext)
		err := r.c.Stage(ctx, &staged)
		if status.Code(unwrapStatus(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("staging %s with another volume's key: %v; want FAILED_PRECONDITION saying %q", tc.v.Name, err, tc.want)
		}
		t.Logf("refused: %v", err)
		if after := b.RawImage(t, r.drv, tc.v.ID)[:16<<20]; !bytes.Equal(before, after) {
			t.Fatalf("the refused stage changed the first 16 MiB of %s", tc.v.Name)
		}
		if info, err := os.Lstat(tc.v.StagingPath); err == nil && info.IsDir() {
			if mounts := harness.MountsUnder(tc.v.StagingPath); len(mounts) != 0 {
				t.Fatalf("mounted after a refusal: %v", mounts)
			}
		}
	}
	checkNoMappings(t)
}

func unwrapStatus(err error) error {
	for e := err; e != nil; {
		if _, ok := status.FromError(e); ok {
			return e
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			break
		}
		e = u.Unwrap()
	}
	return err
}

func statfsBytes(t *testing.T, path string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks) * st.Bsize
}

// Online expansion: the image, then the mapping, then the filesystem, while
// the volume is published; the data stays.
func encExpand(t *testing.T, b EncryptionBackend) {
	r := newEncRun(t, b)
	ctx := context.Background()
	v := r.volume("pvc-luks-grow", 128<<20, MountCapability("ext4"), encryptedParams, nil)
	r.must(r.c.Attach(ctx, v))
	target := r.target(v, "a")
	r.must(r.c.Publish(ctx, v, target, false))
	p := NewPayload(1 << 20)
	r.must(Write(v, target, p))
	before := statfsBytes(t, target)
	r.must(r.c.ControllerExpand(ctx, v, 256<<20))
	size, err := r.c.NodeExpand(ctx, v, target)
	r.must(err)
	after := statfsBytes(t, target)
	if size < 256<<20 || after < before+100<<20 {
		t.Fatalf("after expansion to 256 MiB: node says %d bytes, the filesystem %d (was %d)", size, after, before)
	}
	mapperSize, err := runOut("blockdev", "--getsize64", r.record(v).Mapper)
	r.must(err)
	r.must(Check(v, target, p))
	t.Logf("grown online: filesystem %d -> %d bytes, mapping %s bytes", before, after, strings.TrimSpace(mapperSize))
}

// A node plugin that restarted finds the open mapping: a repeated stage
// changes nothing, and it publishes, unpublishes and unstages it.
func encRestart(t *testing.T, b EncryptionBackend) {
	r := newEncRun(t, b)
	ctx := context.Background()
	v := r.volume("pvc-luks-restart", 128<<20, MountCapability("ext4"), encryptedParams, nil)
	r.must(r.c.Attach(ctx, v))
	first := r.target(v, "a")
	r.must(r.c.Publish(ctx, v, first, false))
	p := NewPayload(1 << 20)
	r.must(Write(v, first, p))
	mapper := r.record(v).Mapper
	restarted := r.client(r.start())
	r.must(restarted.Stage(ctx, v))
	if got := r.record(v).Mapper; got != mapper {
		t.Fatalf("the restarted plugin's stage moved the volume from %s to %s", mapper, got)
	}
	second := r.target(v, "b")
	r.must(restarted.Publish(ctx, v, second, false))
	r.must(Check(v, second, p))
	r.must(restarted.Unpublish(ctx, v, first))
	r.must(restarted.Unpublish(ctx, v, second))
	r.must(restarted.Unstage(ctx, v))
	checkNoMappings(t)
}

// postOps POSTs to a driver's operators' endpoint, as kubectl-spindle does.
func postOps(drv *harness.Driver, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	resp, err := http.Post(drv.MetricsURL+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: HTTP %d: %s", path, resp.StatusCode, data)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// RotateKey makes the three requests of `kubectl spindle rotate-key` to a
// driver serving both the controller and the node.
func RotateKey(drv *harness.Driver, volumeID string, secrets map[string]string) (*opsapi.KeyRotation, error) {
	var plan opsapi.KeyRotation
	if err := postOps(drv, opsapi.PathRotateKey, opsapi.RotateKeyRequest{VolumeID: volumeID, Secrets: secrets}, &plan); err != nil {
		return nil, err
	}
	plan.Secrets = secrets
	if err := postOps(drv, opsapi.PathRekey, plan, &opsapi.RotatedKey{}); err != nil {
		return nil, err
	}
	if err := postOps(drv, opsapi.PathCommitKey, opsapi.CommitKeyRequest{VolumeID: volumeID, NextWrappedKey: plan.NextWrappedKey}, nil); err != nil {
		return nil, err
	}
	plan.Secrets = nil
	return &plan, nil
}

// A key rotation while a writer syncs records into the volume: no write
// fails, the header ends with the new key only, the old key opens nothing,
// and the volume stages again with what the controller publishes now.
func encRotation(t *testing.T, b EncryptionBackend) {
	r := newEncRun(t, b)
	ctx := context.Background()
	v := r.volume("pvc-luks-rotate", 128<<20, MountCapability("ext4"), encryptedParams, nil)
	r.must(r.c.Attach(ctx, v))
	target := r.target(v, "a")
	r.must(r.c.Publish(ctx, v, target, false))
	rec := r.record(v)
	old := r.passphrase(v.PublishContext, "encryptionWrappedKey")

	var stop atomic.Bool
	var written atomic.Int64
	werr := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(filepath.Join(target, "records"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			werr <- err
			return
		}
		defer f.Close()
		line := bytes.Repeat([]byte("r"), 4095)
		for !stop.Load() {
			if _, err := f.Write(append(line, '\n')); err != nil {
				werr <- err
				return
			}
			if err := f.Sync(); err != nil {
				werr <- err
				return
			}
			written.Add(1)
		}
		werr <- nil
	}()
	time.Sleep(time.Second)
	start := time.Now()
	plan, err := RotateKey(r.drv, v.ID, r.secrets)
	took := time.Since(start)
	time.Sleep(time.Second)
	stop.Store(true)
	if werr := <-werr; werr != nil {
		t.Fatalf("the writer failed during the rotation: %v", werr)
	}
	r.must(err)
	if written.Load() < 2 {
		t.Fatalf("the writer wrote %d records", written.Load())
	}
	next := r.passphrase(map[string]string{"encryptionKMSID": plan.KMSID, "encryptionKeyOwner": plan.KeyOwner, "k": plan.NextWrappedKey}, "k")
	if n := r.keyslots(rec.Device); n != 1 {
		t.Fatalf("%d keyslots after the rotation, want 1", n)
	}
	if testKey(rec.Device, old) || !testKey(rec.Device, next) {
		t.Fatalf("after the rotation: old key opens %t, new key opens %t", testKey(rec.Device, old), testKey(rec.Device, next))
	}
	info, err := os.Stat(filepath.Join(target, "records"))
	r.must(err)
	if info.Size() != written.Load()*4096 {
		t.Fatalf("records file holds %d bytes, %d records were synced", info.Size(), written.Load())
	}
	r.must(r.c.Unpublish(ctx, v, target))
	r.must(r.c.Unstage(ctx, v))
	r.must(r.c.ControllerUnpublish(ctx, v))
	r.must(r.c.ControllerPublish(ctx, v))
	if v.PublishContext["encryptionWrappedKey"] != plan.NextWrappedKey {
		t.Fatal("the controller does not publish the new key")
	}
	r.must(r.c.Stage(ctx, v))
	t.Logf("rotated under a writer in %s (%d records of 4 KiB synced meanwhile, none failed); restaged with the new key", took.Round(time.Millisecond), written.Load())
}

// A snapshot of an encrypted volume restores to an encrypted volume with
// the same data, opened with the same passphrase, wrapped for itself.
func encSnapshot(t *testing.T, b EncryptionBackend) {
	r := newEncRun(t, b)
	ctx := context.Background()
	v := r.volume("pvc-luks-source", 128<<20, MountCapability("ext4"), encryptedParams, nil)
	r.must(r.c.Attach(ctx, v))
	target := r.target(v, "a")
	r.must(r.c.Publish(ctx, v, target, false))
	p := NewPayload(8 << 20)
	r.must(Write(v, target, p))
	luksUUID, err := runOut("cryptsetup", "luksUUID", r.record(v).Device)
	r.must(err)
	sourceKey := r.passphrase(v.PublishContext, "encryptionWrappedKey")
	// A point-in-time copy of a file pool's image needs the volume idle.
	r.must(r.c.Unpublish(ctx, v, target))
	r.must(r.c.Detach(ctx, v))
	snap, err := r.c.Snapshot(ctx, "snap-luks", v)
	r.must(err)
	t.Cleanup(func() { _ = r.c.DeleteSnapshot(context.Background(), snap) })
	restored := r.volume("pvc-luks-restored", 0, MountCapability("ext4"), encryptedParams, FromSnapshot(snap))
	r.must(r.c.Attach(ctx, restored))
	rt := r.target(restored, "a")
	r.must(r.c.Publish(ctx, restored, rt, false))
	r.must(Check(restored, rt, p))
	if got, _ := runOut("cryptsetup", "luksUUID", r.record(restored).Device); got != luksUUID {
		t.Fatalf("the restored volume's LUKS UUID is %q, the source's %q: not a copy of its header", got, luksUUID)
	}
	if got := r.passphrase(restored.PublishContext, "encryptionWrappedKey"); !bytes.Equal(got, sourceKey) {
		t.Fatal("the restored volume's passphrase is not the source's")
	}
	if restored.PublishContext["encryptionWrappedKey"] == v.PublishContext["encryptionWrappedKey"] {
		t.Fatal("the restored volume shares the source's wrapped key instead of its own")
	}
	t.Logf("snapshot %s restored: checksum %s, LUKS UUID %s", snap, p.Sha256[:16], strings.TrimSpace(luksUUID))
}

// The passphrase of a volume is in no process's command line or
// environment while it is staged, in no log line of the driver (at debug
// level) and in no error of a failed stage.
func encKeyLeak(t *testing.T, b EncryptionBackend) {
	r := newEncRun(t, b)
	ctx := context.Background()
	v := r.volume("pvc-luks-leak", 128<<20, MountCapability("ext4"), encryptedParams, nil)
	r.must(r.c.ControllerPublish(ctx, v))
	pass := r.passphrase(v.PublishContext, "encryptionWrappedKey")

	var seen sync.Map // every distinct cmdline and environ captured
	var samples atomic.Int64
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			for _, kind := range []string{"cmdline", "environ"} {
				files, _ := filepath.Glob("/proc/[0-9]*/" + kind)
				for _, f := range files {
					if data, err := os.ReadFile(f); err == nil && len(data) > 0 {
						seen.Store(string(data), f)
					}
				}
			}
			samples.Add(1)
		}
	}()
	// A failed stage first (another Secret), then the stage that formats.
	wrong := r.client(r.drv)
	wrong.Secrets[kmsSecretKey] = "another Secret, 16 bytes or more"
	errWrong := wrong.Stage(ctx, v)
	if errWrong == nil {
		t.Fatal("a stage with another Secret succeeded")
	}
	r.must(r.c.Stage(ctx, v))
	r.must(r.c.Unstage(ctx, v))
	r.must(r.c.Stage(ctx, v))
	close(done)

	var sawCryptsetup bool
	seen.Range(func(k, f any) bool {
		s := k.(string)
		if strings.Contains(s, "cryptsetup") {
			sawCryptsetup = true
		}
		if strings.Contains(s, string(pass)) || strings.Contains(s, r.secrets[kmsSecretKey]) {
			t.Errorf("%s holds key material: %q", f, s)
		}
		return true
	})
	r.logMu.Lock()
	logText := r.log.String()
	r.logMu.Unlock()
	for _, text := range []string{logText, errWrong.Error()} {
		if strings.Contains(text, string(pass)) || strings.Contains(text, r.secrets[kmsSecretKey]) {
			t.Fatal("the driver's log or a stage's error holds key material")
		}
	}
	if len(logText) == 0 || !strings.Contains(logText, "NodeStageVolume") {
		t.Fatal("the driver logged nothing to check")
	}
	t.Logf("%d samples of every /proc/*/cmdline and environ (a cryptsetup among them: %t), %d bytes of driver log, the failed stage's error (%v): no passphrase, no Secret",
		samples.Load(), sawCryptsetup, len(logText), errWrong)
}
