//go:build cluster

package multinode

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const (
	// postgresImage is hack/images.sh postgres: Debian's server, psql and
	// pgbench, user postgres (999).
	postgresImage = "local.test/postgres:15"
	postgresUID   = 999
	// databaseStart bounds a database pod's way to serving on an emulated
	// worker: attach, first-time initdb, or crash recovery.
	databaseStart = 6 * time.Minute
	// nodeLost bounds the wait for the control plane to see a powered-off
	// node NotReady (its node-monitor grace period, 50 s by default).
	nodeLost = 4 * time.Minute
)

// database is a PostgreSQL StatefulSet of one replica whose data is on an
// RBD volume (its claim data-pg-0) of StorageClass sc, confined to the two
// workers; its clients run in pods on a node that is not a worker, so they
// outlive either worker.
type database struct {
	c      *cluster
	ns     string
	sc     string
	client string // the clients' node
	runs   int
}

const statefulSet = "pg"

// The RBD StorageClasses the database runs on: plain, and encrypted
// (encrypted: "true", the built-in KMS, whose Secret is the node-stage one).
const (
	plainRBD     = "spindle-rbd"
	encryptedRBD = "spindle-rbd-encrypted"
)

func (c *cluster) startDatabase(t *testing.T, ns, sc string) *database {
	t.Helper()
	ctx := context.Background()
	d := &database{c: c, ns: ns, sc: sc, client: c.clientNode(t)}
	one := int32(1)
	uid, grace := int64(postgresUID), int64(30)
	onRootMismatch := corev1.FSGroupChangeOnRootMismatch
	labels := map[string]string{"app": statefulSet}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: statefulSet, Namespace: ns},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    &one,
			ServiceName: statefulSet,
			Selector:    &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
							MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{c.a, c.b}}},
						}}},
					}},
					// The volume's root belongs to the server's group once;
					// OnRootMismatch leaves PGDATA's 0700 alone afterwards
					// (the server refuses a group-writable data directory).
					SecurityContext: &corev1.PodSecurityContext{
						RunAsUser: &uid, RunAsGroup: &uid, FSGroup: &uid, FSGroupChangePolicy: &onRootMismatch,
					},
					TerminationGracePeriodSeconds: &grace,
					Containers: []corev1.Container{{
						Name: "postgres", Image: postgresImage, ImagePullPolicy: corev1.PullNever,
						VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/var/lib/postgresql/data"}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"pg_isready", "-h", "/tmp", "-U", "postgres"}}},
							PeriodSeconds: 2, TimeoutSeconds: 20, FailureThreshold: 3,
						},
					}},
				},
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName: &sc,
					Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
				},
			}},
		},
	}
	if _, err := c.Client.AppsV1().StatefulSets(ns).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create StatefulSet %s: %v", statefulSet, err)
	}
	// Before the namespace's cleanup deletes the pods: otherwise the
	// StatefulSet would start them again.
	t.Cleanup(func() {
		_ = c.Client.AppsV1().StatefulSets(ns).Delete(ctx, statefulSet, metav1.DeleteOptions{})
		c.WaitFor(t, "StatefulSet "+statefulSet+" gone", func(ctx context.Context) (bool, error) {
			_, err := c.Client.AppsV1().StatefulSets(ns).Get(ctx, statefulSet, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
	})
	return d
}

// clientNode is where the database's clients run: SPINDLE_E2E_CLIENT_NODE,
// or else a Ready node that is neither worker.
func (c *cluster) clientNode(t *testing.T) string {
	t.Helper()
	if n := os.Getenv("SPINDLE_E2E_CLIENT_NODE"); n != "" {
		return n
	}
	nodes, err := c.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if n.Name != c.a && n.Name != c.b && nodeReady(&n) {
			return n.Name
		}
	}
	t.Skip("no Ready node besides the two workers for the database's clients (set SPINDLE_E2E_CLIENT_NODE)")
	return ""
}

func nodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// serving waits until pod pg-0, other than the one with UID previous, is
// Ready (the server answers pg_isready) and returns it.
func (d *database) serving(t *testing.T, previous types.UID) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	d.c.WaitForWithin(t, "PostgreSQL serving in pod "+statefulSet+"-0", databaseStart, func(ctx context.Context) (bool, error) {
		p, err := d.c.Client.CoreV1().Pods(d.ns).Get(ctx, statefulSet+"-0", metav1.GetOptions{})
		if err != nil || p.UID == previous || p.DeletionTimestamp != nil || p.Status.PodIP == "" {
			return false, err
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				pod = p
				return true, nil
			}
		}
		return false, nil
	})
	return pod
}

// clientPod starts a pod on the clients' node that runs script (sh) with
// libpq's variables pointing at the server on host.
func (d *database) clientPod(t *testing.T, host, script string) string {
	t.Helper()
	d.runs++
	name := fmt.Sprintf("client-%d", d.runs)
	grace := int64(1)
	noToken := false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.ns},
		Spec: corev1.PodSpec{
			NodeName: d.client,
			// The clients' node reaches the workers' pods by their IPs.
			HostNetwork:                   true,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &noToken,
			Containers: []corev1.Container{{
				Name: "client", Image: postgresImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", script},
				Env: []corev1.EnvVar{{Name: "PGHOST", Value: host}, {Name: "PGUSER", Value: "postgres"},
					{Name: "PGDATABASE", Value: "postgres"}, {Name: "PGCONNECT_TIMEOUT", Value: "10"}},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
		},
	}
	if _, err := d.c.Client.CoreV1().Pods(d.ns).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create client pod %s: %v", name, err)
	}
	return name
}

// run runs script in a client pod to its successful end and returns its log.
func (d *database) run(t *testing.T, host, script string) string {
	t.Helper()
	name := d.clientPod(t, host, script)
	d.c.WaitPod(t, d.ns, name, corev1.PodSucceeded)
	return d.c.PodLog(t, d.ns, name)
}

// query runs one SQL statement and returns psql's unaligned output.
func (d *database) query(t *testing.T, host, sql string) string {
	t.Helper()
	return strings.TrimSpace(d.run(t, host, "exec psql -v ON_ERROR_STOP=1 -Atq -c '"+sql+"'"))
}

var processed = regexp.MustCompile(`number of transactions actually processed: (\d+)/(\d+)`)

// pgbench runs pgbench's TPC-B-like load (two clients, n transactions
// each) to its end and returns the transactions it reports committed;
// each adds one row to pgbench_history.
func (d *database) pgbench(t *testing.T, host string, n int) int {
	t.Helper()
	out := d.run(t, host, "exec pgbench -n -c 2 -t "+strconv.Itoa(n))
	m := processed.FindStringSubmatch(out)
	if m == nil || m[1] != m[2] {
		t.Fatalf("pgbench did not commit every transaction:\n%s", out)
	}
	got, _ := strconv.Atoi(m[1])
	return got
}

func (d *database) historyRows(t *testing.T, host string) int {
	t.Helper()
	out := d.query(t, host, "SELECT count(*) FROM pgbench_history")
	n, err := strconv.Atoi(out)
	if err != nil {
		t.Fatalf("count of pgbench_history: %q", out)
	}
	return n
}

// volumeOf is the claim's PV and the volume ID.
func (d *database) volumeOf(t *testing.T) (pv, volumeID string) {
	t.Helper()
	ctx := context.Background()
	pvc, err := d.c.Client.CoreV1().PersistentVolumeClaims(d.ns).Get(ctx, "data-"+statefulSet+"-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.c.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p.Name, p.Spec.CSI.VolumeHandle
}

// attachedOnlyTo checks that the PV has one VolumeAttachment, attached, on
// node, and that the other worker's plugin, if it can be asked (other is
// not empty: a lost node cannot), has nothing of it.
func (d *database) attachedOnlyTo(t *testing.T, pv, volumeID, node, other string) {
	t.Helper()
	vas, err := d.c.AttachmentsOf(context.Background(), pv)
	if err != nil {
		t.Fatal(err)
	}
	if len(vas) != 1 || vas[0].Spec.NodeName != node || !vas[0].Status.Attached {
		var got []string
		for _, a := range vas {
			got = append(got, fmt.Sprintf("%s on %s attached=%v", a.Name, a.Spec.NodeName, a.Status.Attached))
		}
		t.Errorf("VolumeAttachments of %s: %v, want one, attached, on %s", pv, got, node)
	}
	staged, _ := d.c.stagedOn(t, node, volumeID)
	if len(staged) != 1 || !strings.HasPrefix(staged[0].Device, "/dev/rbd") {
		t.Errorf("%s's node plugin shows staged %+v, want the volume once on a /dev/rbd device (krbd)", node, staged)
	} else if enc := d.sc == encryptedRBD; staged[0].Encrypted != enc ||
		enc && (!strings.HasPrefix(staged[0].CryptMapping, "/dev/mapper/spindle-") || !strings.HasPrefix(staged[0].MapperDevice, "/dev/dm-") || staged[0].Problem != "") {
		t.Errorf("%s's node plugin shows staged %+v; want encrypted %t (a dm-crypt mapping /dev/mapper/spindle-… on /dev/dm-N, no problem)", node, staged[0], enc)
	}
	if other == "" {
		return
	}
	if staged, devices := d.c.stagedOn(t, other, volumeID); len(staged) != 0 || len(devices) != 0 {
		t.Errorf("%s's node plugin still has the volume: staged %+v, devices %+v", other, staged, devices)
	}
}

// otherWorker is the worker that is not node.
func (c *cluster) otherWorker(node string) string {
	if node == c.a {
		return c.b
	}
	return c.a
}

// setUnschedulable cordons or uncordons a node.
func (c *cluster) setUnschedulable(t *testing.T, node string, on bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
	if _, err := c.Client.CoreV1().Nodes().Patch(context.Background(), node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("cordon %s (%v): %v", node, on, err)
	}
}

// TestPostgresOnRBDMovesBetweenNodes: PostgreSQL on an RBD volume (krbd)
// serves pgbench on one worker; that worker is cordoned and the pod
// deleted; the StatefulSet's pod comes up on the other worker, the
// VolumeAttachment moves with it, every transaction pgbench saw committed
// is there, and pgbench runs again.
func TestPostgresOnRBDMovesBetweenNodes(t *testing.T) {
	movesBetweenNodes(t, plainRBD)
}

// TestPostgresOnEncryptedRBD: the same database on an encrypted RBD volume
// (dm-crypt, LUKS2, between krbd's device and ext4): it moves between the
// workers with every commit, and survives a power cut of its worker as
// the unencrypted one does; each worker's plugin shows the volume staged
// through its dm-crypt mapping.
func TestPostgresOnEncryptedRBD(t *testing.T) {
	t.Run("moves-between-nodes", func(t *testing.T) { movesBetweenNodes(t, encryptedRBD) })
	t.Run("power-cut", func(t *testing.T) {
		nodeLoss{how: "power cut", lose: "kill", restore: "start", storageClass: encryptedRBD}.run(t)
	})
}

func movesBetweenNodes(t *testing.T, sc string) {
	c := connect(t)
	ns := c.Namespace(t)
	ctx := context.Background()
	d := c.startDatabase(t, ns, sc)
	start := time.Now()
	first := d.serving(t, "")
	from, to := first.Spec.NodeName, c.otherWorker(first.Spec.NodeName)
	t.Logf("PostgreSQL on %s serving on %s (%s) %.0fs after the StatefulSet was created (provision, attach, initdb)", sc, from, first.Status.PodIP, time.Since(start).Seconds())
	pv, volumeID := d.volumeOf(t)

	d.run(t, first.Status.PodIP, "exec pgbench -i -s 1 -q")
	committed := d.pgbench(t, first.Status.PodIP, 100)
	if got := d.historyRows(t, first.Status.PodIP); got != committed {
		t.Fatalf("pgbench committed %d transactions but pgbench_history has %d rows", committed, got)
	}
	d.attachedOnlyTo(t, pv, volumeID, from, to)

	c.setUnschedulable(t, from, true)
	t.Cleanup(func() { c.setUnschedulable(t, from, false) })
	deleted := time.Now()
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, first.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pod %s: %v", first.Name, err)
	}
	moved := d.serving(t, first.UID)
	t.Logf("pod move: deleted on %s, serving on %s %.1fs later", from, moved.Spec.NodeName, time.Since(deleted).Seconds())
	if moved.Spec.NodeName != to {
		t.Fatalf("the database came back on %s, want %s (%s is cordoned)", moved.Spec.NodeName, to, from)
	}
	d.attachedOnlyTo(t, pv, volumeID, to, from)

	if got := d.historyRows(t, moved.Status.PodIP); got != committed {
		t.Fatalf("after the move pgbench_history has %d rows, want the %d pgbench committed on %s", got, committed, from)
	}
	again := d.pgbench(t, moved.Status.PodIP, 50)
	if got := d.historyRows(t, moved.Status.PodIP); got != committed+again {
		t.Errorf("pgbench_history has %d rows after pgbench ran again, want %d", got, committed+again)
	}
}

// ledgerWriter is the kill test's client: it sets up pgbench's tables and
// a ledger, runs pgbench in the background, and inserts ledger rows one
// transaction at a time, printing "committed N" only once the server has
// acknowledged N's commit. When the server is gone (libpq's TCP user
// timeout) it prints "stopped at N" and ends.
const ledgerWriter = `set -u
pgbench -i -s 1 -q
psql -v ON_ERROR_STOP=1 -q -c 'CREATE TABLE ledger (n int PRIMARY KEY)'
pgbench -n -c 2 -T 3600 >/dev/null 2>&1 &
n=0
while :; do
  n=$((n + 1))
  if ! psql -v ON_ERROR_STOP=1 -Atq -c "INSERT INTO ledger VALUES ($n)" \
    "host=$PGHOST connect_timeout=5 tcp_user_timeout=5000 keepalives_idle=1 keepalives_interval=1 keepalives_count=3"; then
    echo "stopped at $n"
    break
  fi
  echo "committed $n"
done
kill $! 2>/dev/null
exit 0
`

// workersScript is hack/local-cluster/workers.sh, which cuts a worker's
// power; without it the node-loss test cannot run.
func workersScript(t *testing.T) string {
	s := os.Getenv("SPINDLE_E2E_WORKERS_SCRIPT")
	if s == "" {
		t.Skip("SPINDLE_E2E_WORKERS_SCRIPT is not set: the test must power a worker off (make e2e-multinode sets it)")
	}
	return s
}

func worker(t *testing.T, script string, args ...string) {
	t.Helper()
	out, err := exec.Command(script, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", script, strings.Join(args, " "), err, out)
	}
}

const outOfService = "node.kubernetes.io/out-of-service"

// setOutOfService adds or removes the taint of Kubernetes' non-graceful
// node shutdown.
func (c *cluster) setOutOfService(t *testing.T, node string, on bool) {
	t.Helper()
	ctx := context.Background()
	n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var taints []corev1.Taint
	for _, tt := range n.Spec.Taints {
		if tt.Key != outOfService {
			taints = append(taints, tt)
		}
	}
	if on {
		taints = append(taints, corev1.Taint{Key: outOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
	}
	n.Spec.Taints = taints
	if _, err := c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("taint %s %s (%v): %v", node, outOfService, on, err)
	}
}

// TestNodeLossFencesRBDAndDatabaseRecovers: the worker running PostgreSQL
// loses its power while pgbench and a ledger writer commit. The test takes
// Kubernetes' non-graceful node shutdown steps (node NotReady, taint
// out-of-service); the attach-detach controller force-detaches the volume,
// the StatefulSet's pod starts on the other worker, PostgreSQL recovers
// from its WAL and every commit the writer saw acknowledged is there. The
// controller's log gives the fencing timeline. The lost worker then boots
// again and its node plugin has nothing of the volume left.
func TestNodeLossFencesRBDAndDatabaseRecovers(t *testing.T) {
	nodeLoss{how: "power cut", lose: "kill", restore: "start"}.run(t)
}

// TestIsolatedNodeIsFencedBeforeItsVolumeMoves: the worker running
// PostgreSQL loses only its API server connection, so the cluster sees it
// NotReady while its kernel still has the image mapped and the server
// still commits. The taint is applied as for a node that is off (the
// mistake fencing exists for): before the other worker gets the volume the
// controller must blocklist the isolated node's client, whose server then
// cannot commit any more; every commit acknowledged by either server is
// there after recovery. When the node reaches the API server again, its
// kubelet and node plugin remove the fenced mount and mapping.
func TestIsolatedNodeIsFencedBeforeItsVolumeMoves(t *testing.T) {
	nodeLoss{how: "API server connection cut", lose: "isolate", restore: "rejoin", mustFence: true}.run(t)
}

// nodeLoss is a worker lost under a database: how (workers.sh lose) it is
// lost and brought back (workers.sh restore), whether the controller must
// have blocklisted its client (it still holds the image open), and the
// database's StorageClass (plainRBD when empty).
type nodeLoss struct {
	how, lose, restore string
	mustFence          bool
	storageClass       string
}

func (l nodeLoss) run(t *testing.T) {
	script := workersScript(t)
	c := connect(t)
	ns := c.Namespace(t)
	sc := l.storageClass
	if sc == "" {
		sc = plainRBD
	}
	d := c.startDatabase(t, ns, sc)
	first := d.serving(t, "")
	lost, survivor := first.Spec.NodeName, c.otherWorker(first.Spec.NodeName)
	pv, volumeID := d.volumeOf(t)
	writer := d.clientPod(t, first.Status.PodIP, ledgerWriter)
	c.WaitPod(t, ns, writer, corev1.PodRunning)
	c.WaitForWithin(t, "20 ledger commits", databaseStart, func(ctx context.Context) (bool, error) {
		log, err := c.Client.CoreV1().Pods(ns).GetLogs(writer, &corev1.PodLogOptions{}).DoRaw(ctx)
		return len(committedLedger(string(log))) >= 20, err
	})

	// The lost node comes back, untainted, whatever happens.
	lostAt := time.Now()
	worker(t, script, l.lose, lost)
	t.Logf("%s: %s at %s", lost, l.how, lostAt.Format(time.RFC3339))
	restored := false
	t.Cleanup(func() {
		if !restored {
			worker(t, script, l.restore, lost)
		}
		c.setOutOfService(t, lost, false)
	})

	c.WaitForWithin(t, lost+" NotReady", nodeLost, func(ctx context.Context) (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, lost, metav1.GetOptions{})
		return err == nil && !nodeReady(n), err
	})
	notReady := time.Since(lostAt)
	c.setOutOfService(t, lost, true)
	tainted := time.Since(lostAt)
	recovered := d.serving(t, first.UID)
	serving := time.Since(lostAt)
	t.Logf("node loss: NotReady after %.0fs, tainted %s after %.0fs, PostgreSQL serving on %s after %.0fs",
		notReady.Seconds(), outOfService, tainted.Seconds(), recovered.Spec.NodeName, serving.Seconds())
	if recovered.Spec.NodeName != survivor {
		t.Fatalf("the database came back on %s, want %s", recovered.Spec.NodeName, survivor)
	}
	if dbLog := c.PodLog(t, ns, recovered.Name); !strings.Contains(dbLog, "automatic recovery in progress") {
		t.Errorf("the new server's log shows no crash recovery:\n%s", dbLog)
	} else {
		t.Logf("the new server recovered from its WAL:\n%s", grepLines(dbLog, "redo done", "automatic recovery", "ready to accept"))
	}

	// What the new server has, then what the writer saw acknowledged: a
	// commit the lost server acknowledged after this query (it was not
	// fenced) shows as missing.
	rows := d.query(t, recovered.Status.PodIP, "SELECT n FROM ledger ORDER BY n")
	log := c.PodLog(t, ns, writer)
	acknowledged := committedLedger(log)
	present := map[string]bool{}
	for _, n := range strings.Fields(rows) {
		present[n] = true
	}
	var missing []string
	for _, n := range acknowledged {
		if !present[n] {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		t.Errorf("commits the writer saw acknowledged are missing after recovery: %v", missing)
	}
	t.Logf("ledger: the writer saw %d commits acknowledged (last line: %q); %d rows after recovery, every acknowledged one among them",
		len(acknowledged), lastLine(log), len(present))
	d.attachedOnlyTo(t, pv, volumeID, survivor, "")
	d.pgbench(t, recovered.Status.PodIP, 50)
	t.Logf("fencing timeline (the controller's log):\n%s", c.fencingTimeline(t, lostAt, volumeID, survivor, l.mustFence))

	// The lost worker comes back and its node plugin holds nothing of the
	// volume; then the taint goes, as the procedure ends.
	worker(t, script, l.restore, lost)
	restored = true
	c.WaitForWithin(t, lost+" Ready again", databaseStart, func(ctx context.Context) (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, lost, metav1.GetOptions{})
		return err == nil && nodeReady(n), err
	})
	c.setOutOfService(t, lost, false)
	// The plugin's pod status may still be the one from before the loss:
	// what counts is that the plugin answers, with nothing of the volume.
	c.WaitForWithin(t, "the node plugin on "+lost+" answering, with nothing of "+volumeID, databaseStart, func(ctx context.Context) (bool, error) {
		v, err := c.TryNodeVolumes(ctx, lost)
		if err != nil {
			return false, err
		}
		for _, s := range v.Staged {
			if s.VolumeID == volumeID {
				return false, fmt.Errorf("%s came back with the volume staged: %+v", lost, s)
			}
		}
		for _, d := range v.Devices {
			if d.VolumeID == volumeID {
				return false, fmt.Errorf("%s came back with the volume attached: %+v", lost, d)
			}
		}
		return true, nil
	})
	t.Logf("%s back: Ready and its node plugin has nothing of the volume, %.0fs after it was lost", lost, time.Since(lostAt).Seconds())
}

var committedLine = regexp.MustCompile(`(?m)^committed (\d+)$`)

func committedLedger(log string) []string {
	var out []string
	for _, m := range committedLine.FindAllStringSubmatch(log, -1) {
		out = append(out, m[1])
	}
	return out
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// grepLines is the lines of s that contain any of words, joined.
func grepLines(s string, words ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				out = append(out, strings.TrimSpace(l))
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// fencingTimeline is what the controller logged since the node was lost
// about the volume's publishes and the Ceph commands that decide fencing:
// the watchers it looked for (rbd status) and the clients it blocklisted.
// It fails the test if a client was blocklisted only after the survivor
// was granted the volume, or, with mustFence, if none was before.
func (c *cluster) fencingTimeline(t *testing.T, since time.Time, volumeID, survivor string, mustFence bool) string {
	t.Helper()
	var lines []string
	granted, fenced := "", ""
	for _, l := range strings.Split(c.ControllerLog(t, since), "\n") {
		var e struct {
			Time     string   `json:"time"`
			Msg      string   `json:"msg"`
			Method   string   `json:"method"`
			Duration string   `json:"duration"`
			Code     string   `json:"code"`
			VolumeID string   `json:"volumeID"`
			NodeID   string   `json:"nodeID"`
			Name     string   `json:"name"`
			Args     []string `json:"args"`
			Exit     *int     `json:"exitCode"`
			Error    string   `json:"error"`
		}
		if json.Unmarshal([]byte(l), &e) != nil {
			continue
		}
		args := strings.Join(e.Args, " ")
		switch {
		case strings.HasPrefix(e.Method, "Controller") && e.VolumeID == volumeID:
			lines = append(lines, fmt.Sprintf("%s %s node %s: %s in %s %s", e.Time, e.Method, e.NodeID, e.Code, e.Duration, e.Error))
			if e.Method == "ControllerPublishVolume" && e.NodeID == survivor && e.Code == "OK" && granted == "" {
				granted = e.Time
			}
		case e.Msg == "command" && e.Exit != nil && (e.Name == "ceph" || strings.HasPrefix(args, "status ")):
			lines = append(lines, fmt.Sprintf("%s %s %s: exit %d in %s", e.Time, e.Name, args, *e.Exit, e.Duration))
			if e.Name == "ceph" && strings.Contains(args, "blocklist add") && *e.Exit == 0 {
				if granted != "" {
					t.Errorf("the controller blocklisted a client at %s, after granting %s the volume at %s", e.Time, survivor, granted)
				} else if fenced == "" {
					fenced = e.Time
				}
			}
		}
	}
	if granted == "" {
		t.Errorf("the controller's log has no successful ControllerPublishVolume of %s to %s", volumeID, survivor)
	}
	if mustFence && fenced == "" {
		t.Errorf("the lost node still had the volume open, but the controller blocklisted no client before granting it to %s", survivor)
	}
	return strings.Join(lines, "\n")
}
