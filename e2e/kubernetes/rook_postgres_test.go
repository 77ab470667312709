//go:build cluster

package kubernetes

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/e2e/kube"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// postgresImage is hack/images.sh postgres (Debian's server, psql and
// pgbench, user postgres 999), imported by hack/local-cluster/e2e.sh with
// the Ceph of the run.
const postgresImage = "local.test/postgres:15"

// The server listens only on its socket in /tmp: the pods share the
// host's network, and the socket keeps them off any port of the machine.
// A restored snapshot of a running server holds its postmaster.pid, which
// names a PID of the old pod; in this pod's own PID namespace that PID can
// be one of this script's children (pg_isready, sleep), and PostgreSQL then
// refuses to start ("lock file postmaster.pid already exists"). No other
// server can use this pod's claim, so a lock file found here is stale.
const pgStart = `rm -f "$PGDATA/postmaster.pid"
spindle-postgres -c listen_addresses= & pg=$!
until pg_isready -h /tmp -q; do kill -0 $pg || exit 1; sleep 1; done
`

// pgSum is one line that changes with any row of pgbench_accounts: the
// row count and an md5 of every (aid, abalance) in order.
const pgSum = `psql -h /tmp -U postgres -v ON_ERROR_STOP=1 -Atq -c "SELECT count(*) || ' ' || md5(string_agg(aid || ':' || abalance, ',' ORDER BY aid)) FROM pgbench_accounts"`

// postgresPod runs script (sh -e, after the server started on the
// claim's data) in a PostgreSQL pod on claim; ready says the pod is
// Ready only once /tmp/ready exists and the server answers. The image
// has sh, sleep, cat and rm besides PostgreSQL's programs (hack/images.sh).
func (c *cluster) postgresPod(t *testing.T, ns, name, claim, script string, ready bool) {
	t.Helper()
	uid, grace, noToken := int64(999), int64(30), false
	onRootMismatch := corev1.FSGroupChangeOnRootMismatch
	container := corev1.Container{
		Name: "postgres", Image: postgresImage, ImagePullPolicy: corev1.PullNever,
		Command:                  []string{"sh", "-ec", pgStart + script},
		VolumeMounts:             []corev1.VolumeMount{{Name: "data", MountPath: "/var/lib/postgresql/data"}},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	if ready {
		container.ReadinessProbe = &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "test -f /tmp/ready && pg_isready -h /tmp -q"}}},
			PeriodSeconds: 2,
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName: c.Node, HostNetwork: true, RestartPolicy: corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace, AutomountServiceAccountToken: &noToken,
			SecurityContext: &corev1.PodSecurityContext{RunAsUser: &uid, RunAsGroup: &uid, FSGroup: &uid, FSGroupChangePolicy: &onRootMismatch},
			Containers:      []corev1.Container{container},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
			}}},
		},
	}
	if _, err := c.Client.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
}

// clusterMap is the cluster map file the driver reads, when the driver
// is a host process of the cluster (make e2e, DEPLOY=process): the test
// rewrites it on this machine as kubelet rewrites the file of Rook's
// ConfigMap in the driver's pod.
type clusterMap struct {
	file    string // the map, as Rook's ConfigMap becomes a file
	movedTo string // the monitor's other address (msgr1)
}

// requireClusterMap skips unless the run's Ceph is reached through a
// cluster map file that the test may rewrite.
func requireClusterMap(t *testing.T) (rookCeph, *cluster, clusterMap) {
	t.Helper()
	r := requireRookCeph(t)
	m := clusterMap{file: os.Getenv("SPINDLE_E2E_CLUSTER_MAP"), movedTo: os.Getenv("SPINDLE_E2E_CEPH_MON_V1")}
	if m.file == "" || m.movedTo == "" {
		t.Skip("SPINDLE_E2E_CLUSTER_MAP and SPINDLE_E2E_CEPH_MON_V1 are set by hack/local-cluster/e2e.sh (DEPLOY=process)")
	}
	if _, err := os.Stat(m.file); err != nil {
		t.Skipf("the driver's cluster map is not a file on this machine (%v): this test rewrites the map the driver reads", err)
	}
	return r, connect(t), m
}

// rewrite replaces the map file as kubelet updates a ConfigMap volume (a
// new file renamed over the old): the returned function sets its one
// cluster's monitors. The original comes back when the test ends.
func (m clusterMap) rewrite(t *testing.T) func(monitors ...string) {
	t.Helper()
	original, err := os.ReadFile(m.file)
	if err != nil {
		t.Fatal(err)
	}
	write := func(content []byte) error {
		if err := os.WriteFile(m.file+".new", content, 0o644); err != nil {
			return err
		}
		return os.Rename(m.file+".new", m.file)
	}
	t.Cleanup(func() {
		if err := write(original); err != nil {
			t.Errorf("restore the cluster map: %v", err)
		}
	})
	var entries []map[string]any
	if err := json.Unmarshal(original, &entries); err != nil || len(entries) != 1 {
		t.Fatalf("the cluster map %s: %v, %d clusters", m.file, err, len(entries))
	}
	return func(monitors ...string) {
		t.Helper()
		entries[0]["monitors"] = monitors
		b, err := json.Marshal(entries)
		if err == nil {
			err = write(b)
		}
		if err != nil {
			t.Fatalf("rewrite the cluster map: %v", err)
		}
	}
}

var pgSumLine = regexp.MustCompile(`(?m)^sum: (\d+ [0-9a-f]{32})$`)

// TestRookStorageClassUnchanged (one node; the multi-node version is not
// written): what a Rook user brings, unchanged but for the provisioner:
// Rook's example StorageClass and VolumeSnapshotClass, its two secrets,
// the cluster map as Rook's ConfigMap holds it. PostgreSQL runs on a claim
// of the class and is loaded by pgbench; a snapshot taken while the server
// runs (crash-consistent, as a user takes one) restores into a claim on
// which a second server recovers and finds every row. Then the map moves
// the monitor to its other address: a new claim of the class provisions
// and mounts, and the database pod is never restarted and still serves.
func TestRookStorageClassUnchanged(t *testing.T) {
	r, c, m := requireClusterMap(t)
	r.rookNamespace(t, c)
	class, snapClass := rookClasses(t, c)
	ns := c.Namespace(t)
	ctx := context.Background()

	_, pv := c.Claim(t, ns, "pgdata", kube.ClaimOptions{StorageClass: class})
	if pv.Spec.CSI.FSType != "ext4" || !strings.Contains(pv.Spec.CSI.VolumeHandle, "replicapool") {
		t.Fatalf("the claim's PV: fsType %q, handle %q; want Rook's class's ext4 on replicapool", pv.Spec.CSI.FSType, pv.Spec.CSI.VolumeHandle)
	}
	// Load (pgbench scale 5: 500000 accounts), then transactions that
	// change balances, a checkpoint, and the sum; the server keeps running.
	c.postgresPod(t, ns, "pg", "pgdata", `pgbench -h /tmp -U postgres -q -i -s 5 postgres
pgbench -h /tmp -U postgres -n -c 2 -t 300 postgres
psql -h /tmp -U postgres -Atq -c CHECKPOINT
echo "sum: $(`+pgSum+`)"
: >/tmp/ready
wait $pg
`, true)
	var db *corev1.Pod
	c.WaitForWithin(t, "PostgreSQL loaded and ready in pod pg", 10*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "pg", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			db = p // ended: no use waiting
			return true, nil
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				db = p
				return true, nil
			}
		}
		return false, nil
	})
	if db.Status.Phase != corev1.PodRunning {
		t.Fatalf("pod pg ended %s: %s", db.Status.Phase, kube.TerminationMessage(db))
	}
	found := pgSumLine.FindStringSubmatch(c.PodLog(t, ns, "pg"))
	if found == nil {
		t.Fatalf("pod pg printed no sum:\n%s", c.PodLog(t, ns, "pg"))
	}
	sum := found[1]
	if !strings.HasPrefix(sum, "500000 ") {
		t.Fatalf("pgbench_accounts: %q, want 500000 rows", sum)
	}

	// A snapshot of the running database with Rook's snapshot class; a
	// server on its restore recovers from the WAL and finds every row.
	c.snapshot(t, ns, "pg-snap", snapClass, "pgdata")
	group := "snapshot.storage.k8s.io"
	c.Claim(t, ns, "pgdata-restored", kube.ClaimOptions{StorageClass: class, DataSource: &corev1.TypedLocalObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "pg-snap"}})
	c.postgresPod(t, ns, "pg-restored", "pgdata-restored", `sum=$(`+pgSum+`)
echo "sum: $sum"
pgbench -h /tmp -U postgres -n -c 2 -t 50 postgres
echo "$sum" >/dev/termination-log
kill -INT $pg
wait $pg
`, false)
	restored := c.WaitPod(t, ns, "pg-restored", corev1.PodSucceeded)
	if got := kube.TerminationMessage(restored); got != sum {
		t.Fatalf("the restored database has %q, the original %q", got, sum)
	}
	// The snapshot caught a running server: the restore's server must
	// have recovered (a clean shutdown in the image would mean the test
	// did not take what it says it takes).
	if log := c.PodLog(t, ns, "pg-restored"); !strings.Contains(log, "automatic recovery in progress") {
		t.Fatalf("the server on the restored snapshot did not recover from a crash-consistent image:\n%s", log)
	}

	// The monitor moves: the map names its other address (msgr1), as
	// Rook's ConfigMap does after a mon failover. A new claim provisions
	// and mounts; the database pod is untouched.
	m.rewrite(t)(m.movedTo)
	c.Claim(t, ns, "after-move", kube.ClaimOptions{StorageClass: class})
	wrote := c.writeFile(t, ns, "writer", "after-move")
	c.DeletePod(t, ns, "writer")
	c.Pod(t, ns, "reader", "after-move", kube.PodOptions{Args: []string{"verify", "/data/file"}})
	if msg := kube.TerminationMessage(c.WaitPod(t, ns, "reader", corev1.PodSucceeded)); msg != "verified "+wrote {
		t.Fatalf("the reader of the claim made after the move says %q, want verified %s", msg, wrote)
	}
	now, err := c.Client.CoreV1().Pods(ns).Get(ctx, "pg", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now.UID != db.UID || now.Status.Phase != corev1.PodRunning || len(now.Status.ContainerStatuses) != 1 ||
		now.Status.ContainerStatuses[0].RestartCount != 0 || !now.Status.ContainerStatuses[0].Ready {
		t.Fatalf("after the monitor move the database pod is %s %s (uid %s, was %s), statuses %+v; want the same pod Running and Ready, never restarted",
			now.Name, now.Status.Phase, now.UID, db.UID, now.Status.ContainerStatuses)
	}
	t.Logf("Rook's classes unchanged: PostgreSQL on %s (ext4, %s), pgbench_accounts %s; the snapshot restored with the same sum after crash recovery; after the map moved the monitor to %s a new claim provisioned and mounted, the database pod never restarted",
		pv.Name, class, sum, m.movedTo)
}
