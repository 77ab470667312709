// Package rbdstatic is a testdriver of the Kubernetes external storage
// suite for Spindle's pre-provisioned RBD volumes (ceph-csi's static form).
//
// The suite's YAML testdriver (test/e2e/storage/external) implements only
// dynamic provisioning, generic ephemeral and CSI inline volumes: its
// SkipUnsupportedTest skips every "Pre-provisioned PV" pattern, and it has
// no CreateVolume/GetPersistentVolumeSource, since it cannot make the
// volume such a PV names. This driver makes it: an image made with the
// rbd CLI in the Ceph hack/local-cluster/e2e-storage.sh starts, named by a
// PersistentVolume as ceph-csi's static PVs name one (volumeHandle = the
// image's name; volumeAttributes clusterID, pool, staticVolume "true",
// imageFeatures; the node-stage secret), and removed when the test ends.
// It implements storageframework.PreprovisionedPVTestDriver only, so the
// suite registers its pre-provisioned patterns and nothing else.
package rbdstatic

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/kubernetes/test/e2e/framework"
	e2epod "k8s.io/kubernetes/test/e2e/framework/pod"
	e2eskipper "k8s.io/kubernetes/test/e2e/framework/skipper"
	e2evolume "k8s.io/kubernetes/test/e2e/framework/volume"
	storageframework "k8s.io/kubernetes/test/e2e/storage/framework"
)

// Config is where the images are and what the PersistentVolumes name.
type Config struct {
	DriverName      string // the CSI driver of the PVs
	CephConf        string // ceph.conf of the cluster (its keyring line gives the rbd CLI its key)
	RBDCommand      string // the rbd CLI: a program and its leading arguments, space-separated
	ClusterID       string // the PVs' volumeAttributes.clusterID: the rbd backend's cluster
	Pool            string
	ImageSize       string // rbd create --size
	ImageFeatures   string
	SecretName      string // the node-stage (and node-expand) secret of the PVs
	SecretNamespace string
	CommandTimeout  time.Duration // one rbd command
	RemoveTimeout   time.Duration // rbd rm waits this long for the node to let go of the image
}

// RegisterFlags registers the Config's flags (-spindle.*) on fs.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.DriverName, "spindle.driver-name", "spindle.csi.dev", "the CSI driver the pre-provisioned PVs name")
	fs.StringVar(&c.CephConf, "spindle.ceph-conf", "", "ceph.conf of the Ceph cluster the images are made in (required)")
	// A command, not only a path: where this machine's own Ceph client is
	// older than the cluster, the CLI runs in a Ceph root (hack/ceph/run rbd).
	fs.StringVar(&c.RBDCommand, "spindle.rbd-command", "rbd", "the rbd CLI to run, with any leading arguments (space-separated: hack/ceph/run rbd)")
	fs.StringVar(&c.ClusterID, "spindle.rbd-cluster-id", "", "volumeAttributes.clusterID of the PVs: the rbd backend's cluster (required)")
	fs.StringVar(&c.Pool, "spindle.rbd-pool", "", "the pool the images are made in (required)")
	// The size PVs of the suite declare (e2epv's default capacity).
	fs.StringVar(&c.ImageSize, "spindle.rbd-image-size", "2G", "rbd create --size of each image")
	fs.StringVar(&c.ImageFeatures, "spindle.rbd-image-features", "layering", "the images' features (rbd create --image-feature), also the PVs' volumeAttributes.imageFeatures")
	fs.StringVar(&c.SecretName, "spindle.node-stage-secret-name", "", "the node-stage secret of the PVs (cephx userID/userKey); empty: none")
	fs.StringVar(&c.SecretNamespace, "spindle.node-stage-secret-namespace", "kube-system", "its namespace")
	fs.DurationVar(&c.CommandTimeout, "spindle.rbd-command-timeout", 2*time.Minute, "the longest one rbd command may take")
	fs.DurationVar(&c.RemoveTimeout, "spindle.rbd-remove-timeout", 5*time.Minute, "how long removing an image waits for the node to stop using it")
}

// Driver is the testdriver.
type Driver struct {
	cfg  *Config
	info storageframework.DriverInfo
}

var _ storageframework.PreprovisionedPVTestDriver = (*Driver)(nil)

// New returns the driver; cfg is read when a test runs (after the flags).
func New(cfg *Config) *Driver {
	return &Driver{cfg: cfg, info: storageframework.DriverInfo{
		// The suite's name for the driver: in the spec names (as the
		// YAML testdrivers', which e2e-storage.sh's focus expects), the
		// PVs' name prefix, and the kubelet metrics it reads
		// ("kubernetes.io/csi:<name>"); -spindle.driver-name, the PVs'
		// driver, should be the same.
		Name: "spindle.csi.dev",
		// volume_io writes and reads back files of 1 and 100 MiB.
		MaxFileSize:        storageframework.FileSizeMedium,
		SupportedSizeRange: e2evolume.SizeRange{Min: "1Mi"},
		// The PV names the filesystem (no class does): the ones the
		// node formats (ext4, xfs; the suite has no btrfs pattern and
		// Spindle makes no ext3).
		SupportedFsType: sets.NewString("", "ext4", "xfs"),
		// What holds for static volumes through rbd-fuse on the local
		// cluster's one node: the same as the dynamic rbd testdriver's
		// (e2e/storage/testdrivers/rbd.yaml) minus what only dynamic
		// volumes have (snapshots, clones, expansion through the API).
		Capabilities: map[storageframework.Capability]bool{
			storageframework.CapPersistence: true,
			storageframework.CapBlock:       true,
			storageframework.CapExec:        true,
			storageframework.CapMultiPODs:   true,
			storageframework.CapFsGroup:     true,
		},
	}}
}

// GetDriverInfo implements storageframework.TestDriver.
func (d *Driver) GetDriverInfo() *storageframework.DriverInfo { return &d.info }

// SkipUnsupportedTest implements storageframework.TestDriver: only the
// pre-provisioned patterns run (the others are the YAML testdriver's).
func (d *Driver) SkipUnsupportedTest(pattern storageframework.TestPattern) {
	if pattern.VolType != storageframework.PreprovisionedPV {
		e2eskipper.Skipf("Driver %q runs the pre-provisioned PV patterns only, not volume type %q", d.info.Name, pattern.VolType)
	}
}

// PrepareTest implements storageframework.TestDriver.
func (d *Driver) PrepareTest(ctx context.Context, f *framework.Framework) *storageframework.PerTestConfig {
	for flag, v := range map[string]string{"spindle.ceph-conf": d.cfg.CephConf, "spindle.rbd-cluster-id": d.cfg.ClusterID, "spindle.rbd-pool": d.cfg.Pool} {
		if v == "" {
			framework.Failf("-%s is required for the pre-provisioned RBD volumes", flag)
		}
	}
	return &storageframework.PerTestConfig{
		Driver:              d,
		Prefix:              "spindle-rbd-static",
		Framework:           f,
		ClientNodeSelection: e2epod.NodeSelection{Selector: map[string]string{"kubernetes.io/os": "linux"}},
	}
}

// volume is one image of a test.
type volume struct {
	d     *Driver
	image string
}

// CreateVolume implements storageframework.PreprovisionedVolumeTestDriver:
// a blank image, as an owner outside Kubernetes makes one. Its name
// carries the test's namespace, so that what a failed run left is known.
func (d *Driver) CreateVolume(ctx context.Context, config *storageframework.PerTestConfig, volType storageframework.TestVolType) storageframework.TestVolume {
	if volType != storageframework.PreprovisionedPV {
		framework.Failf("driver %s makes only pre-provisioned PVs, not %q", d.info.Name, volType)
	}
	v := &volume{d: d, image: "e2e-static-" + config.Framework.Namespace.Name + "-" + rand.String(5)}
	framework.Logf("creating RBD image %s/%s (%s, features %s)", d.cfg.Pool, v.image, d.cfg.ImageSize, d.cfg.ImageFeatures)
	_, err := d.rbd(ctx, "create", "--size", d.cfg.ImageSize, "--image-feature", d.cfg.ImageFeatures, d.spec(v.image))
	framework.ExpectNoError(err, "create the image of a pre-provisioned PV")
	return v
}

// GetPersistentVolumeSource implements
// storageframework.PreprovisionedPVTestDriver: ceph-csi's static form.
func (d *Driver) GetPersistentVolumeSource(readOnly bool, fsType string, tv storageframework.TestVolume) (*v1.PersistentVolumeSource, *v1.VolumeNodeAffinity) {
	v, ok := tv.(*volume)
	if !ok {
		framework.Failf("test volume of type %T is not one of driver %s", tv, d.info.Name)
	}
	src := &v1.CSIPersistentVolumeSource{
		Driver:       d.cfg.DriverName,
		VolumeHandle: v.image,
		ReadOnly:     readOnly,
		FSType:       fsType,
		VolumeAttributes: map[string]string{
			"clusterID":     d.cfg.ClusterID,
			"pool":          d.cfg.Pool,
			"staticVolume":  "true",
			"imageFeatures": d.cfg.ImageFeatures,
		},
	}
	if d.cfg.SecretName != "" {
		ref := &v1.SecretReference{Name: d.cfg.SecretName, Namespace: d.cfg.SecretNamespace}
		src.NodeStageSecretRef, src.NodeExpandSecretRef = ref, ref
	}
	return &v1.PersistentVolumeSource{CSI: src}, nil
}

// DeleteVolume implements storageframework.TestVolume. The suite deletes
// the pod, the claim and the PV (reclaim policy Retain: Spindle never
// deletes a static image) before it; the node may still be unstaging, and
// rbd refuses to remove an image with watchers, so it tries again until
// the node has let go. The image must then be gone.
func (v *volume) DeleteVolume(ctx context.Context) {
	d := v.d
	deadline := time.Now().Add(d.cfg.RemoveTimeout)
	for {
		_, err := d.rbd(ctx, "rm", "--no-progress", d.spec(v.image))
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			framework.ExpectNoError(err, "remove the image of a pre-provisioned PV (tried for %v)", d.cfg.RemoveTimeout)
		}
		framework.Logf("removing RBD image %s/%s: %v; trying again", d.cfg.Pool, v.image, err)
		time.Sleep(5 * time.Second)
	}
	out, err := d.rbd(ctx, "ls", d.cfg.Pool)
	framework.ExpectNoError(err, "list the pool")
	for _, name := range strings.Fields(out) {
		if name == v.image {
			framework.Failf("image %s/%s is still in the pool after rbd rm", d.cfg.Pool, v.image)
		}
	}
	framework.Logf("removed RBD image %s/%s", d.cfg.Pool, v.image)
}

func (d *Driver) spec(image string) string { return d.cfg.Pool + "/" + image }

// rbd runs the rbd CLI against the cluster of -spindle.ceph-conf, with a
// deadline and the C locale; its stderr is in the error.
func (d *Driver) rbd(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.CommandTimeout)
	defer cancel()
	command := strings.Fields(d.cfg.RBDCommand)
	if len(command) == 0 {
		return "", fmt.Errorf("-spindle.rbd-command is empty")
	}
	args = append([]string{"--conf", d.cfg.CephConf}, args...)
	cmd := exec.CommandContext(ctx, command[0], append(command[1:], args...)...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("rbd %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
