//go:build cluster

package multinode

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/spindle-csi/spindle/e2e/kube"
)

// attachMode is one way a node attaches a volume, with the StorageClass
// hack/local-cluster/multinode.sh makes for it and the device the node
// plugin reports for such a volume.
type attachMode struct {
	name      string
	class     string
	device    string // the staged device's prefix
	encrypted bool   // a dm-crypt mapping between the device and the filesystem
	// userspace: a daemon in the attach daemon's pod serves the volume
	// (rbd-nbd, rbd-fuse, qemu-storage-daemon), not the kernel alone.
	userspace bool
}

var attachModes = []attachMode{
	{name: "loop", class: "spindle-loop", device: "/dev/loop"},
	{name: "iscsi-kernel", class: iscsiClass, device: "/dev/sd"},
	{name: "krbd", class: plainRBD, device: "/dev/rbd"},
	{name: "krbd-encrypted", class: encryptedRBD, device: "/dev/rbd", encrypted: true},
	{name: "rbd-nbd", class: "spindle-rbd-nbd", device: "/dev/nbd", userspace: true},
	// rbd-fuse and the iSCSI userspace path bind a loop device to the file
	// their daemon (in the attach daemon's pod) serves.
	{name: "rbd-fuse", class: "spindle-rbd-fuse", device: "/dev/loop", userspace: true},
	{name: "iscsi-userspace", class: "spindle-iscsi-userspace", device: "/dev/loop", userspace: true},
}

const (
	// maxWriterSecs bounds a records writer that the test fails to stop
	// (every mode's writer starts before the disruption, so the first
	// one waits for the slowest to stage).
	maxWriterSecs = 1800
	// maxGap is the longest pause between two acknowledged records that a
	// node plugin restart may cause (issue 31).
	maxGap = 5 * time.Second
	// writerStartTimeout bounds the wait for a writer to run (an RBD
	// stage's Ceph client calls take 6-12 s each on an emulated worker),
	// and for the stoppers and readers, which every mode starts at once.
	writerStartTimeout = 10 * time.Minute
	// timeOfDay is how the test and the writers (spindle-e2e-pod) print
	// a moment, in UTC.
	timeOfDay = "15:04:05.000"
	// recordsFile is the writer's file on the volume.
	recordsFile = "/data/records"
	// nodePluginTimeout bounds the wait for a node plugin pod to run
	// again, ready, after its pod was deleted or its container killed.
	// On an emulated worker under load that took 4 minutes and more (runs
	// K and O; in run P more than these 10): containerd handled the old
	// container's exit with a 10 s deadline its task delete kept missing,
	// so kubelet could not finish the old pod for minutes. The writers
	// keep writing meanwhile.
	nodePluginTimeout = 10 * time.Minute
)

// TestNodePluginRestartKeepsIO: records writers of several attach modes
// run at once, as a node's volumes would (each a pod committing a numbered
// record every 100 ms to its volume), the modes spread over both workers,
// while the node plugin pod on each worker is deleted and its DaemonSet
// starts a new one; in two rounds, the kernel modes' writers, then the
// userspace modes' (everyRoundThrough). Per mode
// (TestNodePluginRestartKeepsIO/<round>/<mode>): the writer logs no I/O
// error and no gap over 5 s, it is never restarted, the VolumeAttachment
// stays attached throughout, the new plugin's start-up reconcile adopts
// the volume whole on the same device, and every acknowledged record
// reads back afterwards.
func TestNodePluginRestartKeepsIO(t *testing.T) {
	c := connect(t)
	c.everyRoundThrough(t, func(t *testing.T, begin func()) map[string]*corev1.Pod {
		begin()
		old := map[string]*corev1.Pod{}
		for _, n := range c.workers() {
			old[n] = c.nodePlugin(t, n)
			if err := c.Client.CoreV1().Pods(old[n].Namespace).Delete(context.Background(), old[n].Name, metav1.DeleteOptions{}); err != nil {
				t.Fatalf("delete the node plugin pod %s/%s: %v", old[n].Namespace, old[n].Name, err)
			}
			t.Logf("deleted the node plugin pod %s on %s", old[n].Name, n)
		}
		return c.newNodePlugins(t, old)
	})
}

// TestHelmUpgradeKeepsIO: the same writers and rounds while `helm
// upgrade` moves the release to another image tag of the same build
// (multinode.sh imports local.test/spindle:upgrade beside :dev; each round
// moves it to the tag it does not run), which rolls the node plugins on
// both workers and the controller. The same checks per mode as
// TestNodePluginRestartKeepsIO; the attach daemon's pods stay (OnDelete).
// The release gets its first tag back at the end.
func TestHelmUpgradeKeepsIO(t *testing.T) {
	c := connect(t)
	h := helmRelease(t, c)
	first := c.driverTag(t)
	t.Cleanup(func() {
		if c.driverTag(t) != first {
			h.upgrade(t, first)
		}
	})
	c.everyRoundThrough(t, func(t *testing.T, begin func()) map[string]*corev1.Pod {
		begin()
		old, attachd := map[string]*corev1.Pod{}, map[string]*corev1.Pod{}
		for _, n := range c.workers() {
			old[n], attachd[n] = c.nodePlugin(t, n), c.attachDaemonPod(t, n)
		}
		to := "upgrade"
		if c.driverTag(t) == to {
			to = "dev"
		}
		h.upgrade(t, to)
		plugins := c.newNodePlugins(t, old)
		for n, plugin := range plugins {
			if got := imageTag(containerImage(plugin, "spindle")); got != to {
				t.Errorf("the node plugin on %s after the upgrade runs tag %q, want %q", n, got, to)
			}
			if attachd[n] != nil {
				if now := c.attachDaemonPod(t, n); now == nil || now.UID != attachd[n].UID {
					t.Errorf("the upgrade replaced the attach daemon's pod on %s (OnDelete: it must stay)", n)
				}
			}
		}
		return plugins
	})
}

// everyRoundThrough runs everyModeThrough for the kernel attach modes
// (subtest "kernel"), then for the userspace ones ("userspace"), with the
// same disruption each time. All seven writers at once, two emulated
// workers with three or four each, left containerd there unable to finish
// the replaced node plugin's container for more than 10 minutes (runs O
// and P in docs/results/2026-11-29-testing-history.md: every runc call
// missed its deadline); with two on each worker both nodes had their new plugin within 1-2.7 minutes
// (run Q). A real node carries more, on real CPUs.
func (c *cluster) everyRoundThrough(t *testing.T, disrupt func(t *testing.T, begin func()) map[string]*corev1.Pod) {
	t.Helper()
	for _, round := range []struct {
		name      string
		userspace bool
	}{{"kernel", false}, {"userspace", true}} {
		var modes []attachMode
		for _, m := range attachModes {
			if m.userspace == round.userspace {
				modes = append(modes, m)
			}
		}
		// A round's parallel subtests all end before t.Run returns, so
		// the next round starts on workers the last one left.
		t.Run(round.name, func(t *testing.T) { c.everyModeThrough(t, modes, disrupt) })
	}
}

// everyModeThrough starts a records writer of every attach mode of modes,
// each in a parallel subtest named by its mode, on worker a and worker b
// in turn: all seven on one emulated worker saturated it (run K, with the
// node plugin restarting there: a writer that never staged, a plugin
// back after 4 minutes), and a real node's volumes are spread too. Once
// all of them write (or their mode could not start), the subtest
// "disruption" runs disrupt once; it calls begin as it starts to act on
// the nodes (the writers' gaps count from there) and returns the node
// plugin pod that runs on each worker afterwards. Then each mode's subtest
// checks that its writer survived. The parallel subtests start when the
// calling test function returns.
func (c *cluster) everyModeThrough(t *testing.T, modes []attachMode, disrupt func(t *testing.T, begin func()) map[string]*corev1.Pod) {
	t.Helper()
	// Every writer and the disruption run at once: with fewer parallel
	// slots the disruption would wait for writers that cannot start.
	need := len(modes) + 1
	if f := flag.Lookup("test.parallel"); f != nil {
		if n, err := strconv.Atoi(f.Value.String()); err != nil || n < need {
			t.Fatalf("go test -parallel %s: this test runs %d subtests at once; run it with -parallel %d or more (multinode.sh does)", f.Value, need, need)
		}
	}
	// A subtest -run leaves out is never called: the disruption waits
	// only for the writers that run, and the writers need the disruption.
	var writing sync.WaitGroup
	// The writers start one at a time on a worker: four RBD volumes
	// staging at once on an emulated worker made every Ceph client call of
	// every stage take over the driver's 30 s per call, and kubelet's
	// retries did the same again, so none staged in 10 minutes. The
	// disruption still meets all of them running.
	staging := map[string]chan struct{}{}
	for _, n := range c.workers() {
		staging[n] = make(chan struct{}, 1)
	}
	// The writers that run, for the disruption to note how far each got.
	var writersMu sync.Mutex
	var writers []*recordsWriter
	disrupted := make(chan struct{})
	var plugins map[string]*corev1.Pod // set before disrupted is closed
	selected := false
	t.Run("disruption", func(t *testing.T) {
		selected = true
		t.Parallel()
		defer close(disrupted)
		writing.Wait()
		var start time.Time
		begin := func() {
			if !start.IsZero() {
				return
			}
			writersMu.Lock()
			for _, w := range writers {
				w.noteRecordsBefore(t)
			}
			writersMu.Unlock()
			start = time.Now()
		}
		plugins = disrupt(t, begin)
		// The writers print their gaps with the time (UTC): this places
		// them against the disruption.
		t.Logf("the disruption ran from %s to %s UTC", start.UTC().Format(timeOfDay), time.Now().UTC().Format(timeOfDay))
	})
	if !selected {
		t.Fatalf("-run leaves out %s/disruption, which every mode's check needs", t.Name())
	}
	workers := c.workers()
	for i, m := range modes {
		node := workers[i%len(workers)]
		writing.Add(1)
		called := false
		t.Run(m.name, func(t *testing.T) {
			called = true
			t.Parallel()
			var once sync.Once
			started := func() { once.Do(writing.Done) }
			defer started() // a mode that skips or fails to start
			w := func() *recordsWriter {
				staging[node] <- struct{}{}
				defer func() { <-staging[node] }()
				return c.startRecords(t, m, node)
			}()
			writersMu.Lock()
			writers = append(writers, w)
			writersMu.Unlock()
			started()
			<-disrupted
			if plugins[node] == nil {
				t.Fatal("the disruption failed (its subtest says why): nothing to check")
			}
			w.survived(t, plugins[node])
		})
		if !called {
			writing.Done()
		}
	}
}

// recordsWriter is a records writer pod on a worker and its volume.
type recordsWriter struct {
	c        *cluster
	mode     attachMode
	node     string
	ns       string
	pv       string
	volumeID string
	pod      types.UID
	device   string // the staged device before the disruption
	watch    *attachmentWatch
	// before is the last record the writer had logged when the
	// disruption began (it logs every 50th, and each gap over a second):
	// gaps before later records are the disruption's to answer for, and
	// earlier ones are not (run L's loop writer logged a 6.9 s pause at
	// its 15th record, by the worker's clock 1.5 s before the disruption
	// began). The record lags the disruption's start, so a gap just
	// before it still counts.
	before int
}

// noteRecordsBefore notes how far the writer got before the disruption.
func (w *recordsWriter) noteRecordsBefore(t *testing.T) {
	w.before = lastRecordLogged(w.c.PodLog(t, w.ns, "writer"))
}

// startRecords provisions a volume of the mode's class, starts the writer
// on node, waits for its first acknowledged record and checks how the
// node plugin staged it; it watches the VolumeAttachment from then on.
func (c *cluster) startRecords(t *testing.T, m attachMode, node string) *recordsWriter {
	t.Helper()
	ctx := context.Background()
	if _, err := c.Client.StorageV1().StorageClasses().Get(ctx, m.class, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		t.Skipf("no StorageClass %s for the %s attach mode on this cluster (hack/local-cluster/multinode.sh makes it)", m.class, m.name)
	}
	ns := c.Namespace(t)
	_, pv := c.Claim(t, ns, "data", kube.ClaimOptions{StorageClass: m.class, Size: "256Mi"})
	c.Pod(t, ns, "writer", "data", kube.PodOptions{Node: node, Args: []string{"records", recordsFile, strconv.Itoa(maxWriterSecs)}})
	pod := c.WaitPodWithin(t, ns, "writer", corev1.PodRunning, writerStartTimeout)
	c.WaitLogLine(t, ns, "writer", "record 1")
	w := &recordsWriter{c: c, mode: m, node: node, ns: ns, pv: pv.Name, volumeID: pv.Spec.CSI.VolumeHandle, pod: pod.UID}
	staged, _ := c.stagedOn(t, node, w.volumeID)
	if len(staged) != 1 {
		t.Fatalf("%s's node plugin shows the volume staged %d times (%+v), want once", node, len(staged), staged)
	}
	s := staged[0]
	if !strings.HasPrefix(s.Device, m.device) || s.MountState != "mounted" || s.DeviceState != "attached" || s.Problem != "" {
		t.Fatalf("%s's node plugin shows staged %+v; want it mounted from a %s* device (%s), attached, no problem", node, s, m.device, m.name)
	}
	if s.Encrypted != m.encrypted || m.encrypted && !strings.HasPrefix(s.CryptMapping, "/dev/mapper/spindle-") {
		t.Fatalf("%s's node plugin shows staged %+v; want encrypted %t (a /dev/mapper/spindle-… mapping)", node, s, m.encrypted)
	}
	w.device = s.Device
	c.Attachment(t, w.pv, node, "attached", func(a *storagev1.VolumeAttachment) bool { return a.Status.Attached })
	w.watch = c.watchAttachment(w.pv, node)
	t.Cleanup(func() { w.watch.stop() })
	return w
}

// survived is the check after the disruption, plugin being the node
// plugin that now runs on the writer's node: its start-up reconcile adopted the
// volume whole, on the device it had; the writer, stopped now, saw no
// error and no gap over maxGap and was never restarted; the
// VolumeAttachment never left attached; every acknowledged record reads
// back in a new pod.
func (w *recordsWriter) survived(t *testing.T, plugin *corev1.Pod) {
	t.Helper()
	c := w.c
	c.waitAdopted(t, plugin, w.volumeID)
	staged, _ := c.stagedOn(t, w.node, w.volumeID)
	if len(staged) != 1 || staged[0].Device != w.device || staged[0].MountState != "mounted" || staged[0].DeviceState != "attached" || staged[0].Problem != "" {
		t.Errorf("after the disruption %s's node plugin shows staged %+v; want it as before: mounted from %s, attached, no problem", w.node, staged, w.device)
	}
	// A few seconds of records after the plugin is back.
	time.Sleep(3 * time.Second)
	w.finish(t)
}

// finish stops the writer and checks what it saw: no I/O error, no gap
// over maxGap, never restarted, the VolumeAttachment attached throughout;
// then every acknowledged record reads back in a new pod on its node.
func (w *recordsWriter) finish(t *testing.T) {
	t.Helper()
	c := w.c
	// Every mode's stopper and reader start at once: seven new pods took
	// an emulated worker 3-4 minutes, over kube.Timeout.
	c.Pod(t, w.ns, "stopper", "data", kube.PodOptions{Node: w.node, Args: []string{"stop-records", recordsFile}})
	c.WaitPodWithin(t, w.ns, "stopper", corev1.PodSucceeded, writerStartTimeout)
	writer := c.WaitPodWithin(t, w.ns, "writer", corev1.PodSucceeded, writerStartTimeout)
	notAttached := w.watch.stop()

	msg := kube.TerminationMessage(writer)
	var n, errs, gapMS int
	if _, err := fmt.Sscanf(msg, "records %d errors %d maxgap %dms", &n, &errs, &gapMS); err != nil {
		t.Fatalf("the writer's report %q: %v", msg, err)
	}
	gap := time.Duration(gapMS) * time.Millisecond
	log := c.PodLog(t, w.ns, "writer")
	since := longestGapAfter(log, w.before)
	t.Logf("%s: %d records acknowledged, %d I/O errors, longest gap %v; from record %d on (the disruption began after it) %v",
		w.mode.name, n, errs, gap, w.before, since)
	if errs != 0 || since > maxGap {
		t.Errorf("the writer saw %d I/O errors and, from record %d on, a longest gap of %v (at most %v allowed); its log:\n%s",
			errs, w.before, since, maxGap, grepLines(log, "ERROR", "gap"))
	}
	if writer.UID != w.pod {
		t.Errorf("the writer pod was replaced (UID %s, was %s)", writer.UID, w.pod)
	}
	for _, s := range writer.Status.ContainerStatuses {
		if s.RestartCount != 0 {
			t.Errorf("the writer's container %s restarted %d times", s.Name, s.RestartCount)
		}
	}
	if len(notAttached) != 0 {
		t.Errorf("the VolumeAttachment of %s on %s was not attached at times: %s", w.pv, w.node, strings.Join(notAttached, "; "))
	}

	c.Pod(t, w.ns, "reader", "data", kube.PodOptions{Node: w.node, Args: []string{"verify-records", recordsFile, strconv.Itoa(n)}})
	reader := c.WaitPodWithin(t, w.ns, "reader", corev1.PodSucceeded, writerStartTimeout)
	if got, want := kube.TerminationMessage(reader), fmt.Sprintf("verified %d records", n); got != want {
		t.Errorf("the reader says %q, want %q", got, want)
	}
}

// nodePlugin is the chart's node plugin pod on node.
func (c *cluster) nodePlugin(t *testing.T, node string) *corev1.Pod {
	t.Helper()
	return chartPod(t, c, kube.ChartNodePlugins, node)
}

// newNodePlugin waits for a node plugin pod on node other than old, not
// being deleted, with every container ready, and returns it.
func (c *cluster) newNodePlugin(t *testing.T, node string, old types.UID) *corev1.Pod {
	t.Helper()
	return c.waitNodePlugin(t, "a new node plugin pod on "+node+", ready", node, func(p *corev1.Pod) bool { return p.UID != old })
}

// newNodePlugins is newNodePlugin on each node of old (node: the pod that
// ran there before).
func (c *cluster) newNodePlugins(t *testing.T, old map[string]*corev1.Pod) map[string]*corev1.Pod {
	t.Helper()
	plugins := map[string]*corev1.Pod{}
	for n, p := range old {
		plugins[n] = c.newNodePlugin(t, n, p.UID)
	}
	return plugins
}

// waitNodePlugin waits for a running node plugin pod on node, not being
// deleted, that accept takes and whose containers are all ready.
func (c *cluster) waitNodePlugin(t *testing.T, what, node string, accept func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var found *corev1.Pod
	start := time.Now()
	defer func() {
		if found != nil {
			t.Logf("%s: pod %s after %v", what, found.Name, time.Since(start).Round(time.Second))
		}
	}()
	c.WaitForWithin(t, what, nodePluginTimeout, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: kube.ChartNodePlugins, FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false, err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if !accept(p) || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
				continue
			}
			ready := len(p.Status.ContainerStatuses) > 0
			for _, s := range p.Status.ContainerStatuses {
				ready = ready && s.Ready
			}
			if ready {
				found = p
				return true, nil
			}
		}
		return false, nil
	})
	return found
}

// waitAdopted waits for the node plugin's start-up reconcile to log the
// volume found whole ("found a staged volume whole; adopted as it is").
func (c *cluster) waitAdopted(t *testing.T, plugin *corev1.Pod, volumeID string) {
	t.Helper()
	c.WaitFor(t, "the start-up reconcile of "+plugin.Name+" to adopt "+volumeID, func(ctx context.Context) (bool, error) {
		data, err := c.Client.CoreV1().Pods(plugin.Namespace).GetLogs(plugin.Name, &corev1.PodLogOptions{Container: "spindle"}).DoRaw(ctx)
		if err != nil {
			return false, err
		}
		for _, l := range strings.Split(string(data), "\n") {
			var entry struct {
				Msg      string `json:"msg"`
				VolumeID string `json:"volumeID"`
			}
			if json.Unmarshal([]byte(l), &entry) != nil || entry.VolumeID != volumeID {
				continue
			}
			switch {
			case entry.Msg == "found a staged volume whole; adopted as it is":
				return true, nil
			case strings.HasPrefix(entry.Msg, "found a staged volume that is not whole"):
				return false, fmt.Errorf("the start-up reconcile found %s not whole: %s", volumeID, l)
			}
		}
		return false, nil
	})
}

// attachDaemonPod is the chart's attach daemon pod on node, nil when the
// release runs none.
func (c *cluster) attachDaemonPod(t *testing.T, node string) *corev1.Pod {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=spindle,app.kubernetes.io/component=attachd", FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatalf("list the attach daemon's pods: %v", err)
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.DeletionTimestamp == nil {
			return p
		}
	}
	return nil
}

// driverTag is the image tag the node plugin on worker a runs.
func (c *cluster) driverTag(t *testing.T) string {
	t.Helper()
	return imageTag(containerImage(c.nodePlugin(t, c.a), "spindle"))
}

func containerImage(pod *corev1.Pod, name string) string {
	for _, ct := range pod.Spec.Containers {
		if ct.Name == name {
			return ct.Image
		}
	}
	return ""
}

// imageTag is the tag of an image reference ("" without one).
func imageTag(image string) string {
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		return ""
	}
	return image[i+1:]
}

// attachmentWatch polls one VolumeAttachment in the background and keeps
// every moment it was not there and attached.
type attachmentWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	seen   []string
}

func (c *cluster) watchAttachment(pv, node string) *attachmentWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &attachmentWatch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		last := ""
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			vas, err := c.AttachmentsOf(ctx, pv)
			if err != nil {
				continue // the API server did not answer: nothing seen
			}
			state := "missing"
			for _, a := range vas {
				if a.Spec.NodeName == node {
					state = fmt.Sprintf("attached=%v", a.Status.Attached)
					if a.Status.DetachError != nil {
						state += " detachError=" + a.Status.DetachError.Message
					}
				}
			}
			if state != "attached=true" && state != last {
				w.mu.Lock()
				w.seen = append(w.seen, time.Now().UTC().Format(time.RFC3339)+" "+state)
				w.mu.Unlock()
			}
			last = state
		}
	}()
	return w
}

// stop ends the watch and returns what it saw other than attached; it may
// be called more than once.
func (w *attachmentWatch) stop() []string {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen
}

// release is the chart's release as multinode.sh installed it: helm, the
// chart and the values file it generated (SPINDLE_HELM, SPINDLE_E2E_CHART,
// SPINDLE_E2E_HELM_VALUES).
type release struct {
	helm, chart, values, kubeconfig string
}

func helmRelease(t *testing.T, c *cluster) release {
	t.Helper()
	r := release{helm: os.Getenv("SPINDLE_HELM"), chart: os.Getenv("SPINDLE_E2E_CHART"), values: os.Getenv("SPINDLE_E2E_HELM_VALUES"),
		kubeconfig: c.Kubeconfig}
	if r.helm == "" || r.chart == "" || r.values == "" {
		t.Skip("SPINDLE_HELM, SPINDLE_E2E_CHART and SPINDLE_E2E_HELM_VALUES name helm, the chart and the release's values (make e2e-multinode sets them)")
	}
	return r
}

// upgrade runs `helm upgrade` of release spindle in kube-system with the
// release's values and driver.image.tag=tag, and waits for it (--wait:
// the node DaemonSet rolled on both workers, the controller ready).
func (r release) upgrade(t *testing.T, tag string) {
	t.Helper()
	start := time.Now()
	if out, err := r.upgradeTo(r.chart, r.values, "--set", "driver.image.tag="+tag); err != nil {
		t.Fatalf("helm upgrade to tag %s: %v\n%s", tag, err, out)
	}
	t.Logf("helm upgrade to tag %s took %v", tag, time.Since(start).Round(time.Second))
}

// helmUpgradeWait is how long `helm upgrade --wait` waits for the release:
// the node DaemonSet's rolling update replaces one node's plugin at a time,
// and each gets nodePluginTimeout to come back, as in
// TestNodePluginRestartKeepsIO (9 minutes on an emulated worker, run V).
const helmUpgradeWait = 2*nodePluginTimeout + 2*time.Minute

// upgradeTo runs `helm upgrade` of release spindle in kube-system to chart
// with the values file and more flags, and waits for it (--wait).
func (r release) upgradeTo(chart, values string, flags ...string) ([]byte, error) {
	return r.run(append([]string{"upgrade", "spindle", chart, "-f", values, "--wait", "--timeout", helmUpgradeWait.String()}, flags...)...)
}

// run runs helm with args on the release's namespace and cluster, for at
// most an upgrade's wait and a little.
func (r release) run(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), helmUpgradeWait+3*time.Minute)
	defer cancel()
	return exec.CommandContext(ctx, r.helm, append(args, "--namespace", "kube-system", "--kubeconfig", r.kubeconfig)...).CombinedOutput()
}

// deployedChart is the chart the release runs now ("spindle-0.2.0").
func (r release) deployedChart(t *testing.T) string {
	t.Helper()
	out, err := r.run("list", "--filter", "^spindle$", "--output", "json")
	if err != nil {
		t.Fatalf("helm list: %v\n%s", err, out)
	}
	var list []struct {
		Chart string `json:"chart"`
	}
	if err := json.Unmarshal(out, &list); err != nil || len(list) != 1 {
		t.Fatalf("helm list: want release spindle once, got %q (%v)", out, err)
	}
	return list[0].Chart
}
