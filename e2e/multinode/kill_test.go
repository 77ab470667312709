//go:build cluster

package multinode

import (
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/spindle-csi/spindle/e2e/kube"
)

// nodePluginPattern is in the node plugin's command line (its main
// process: spindle --mode=node ...), not in the attach daemon's.
const nodePluginPattern = " --mode=node "

// TestKillDuringStageConverges, per attach mode: a records writer runs on
// worker a while the node plugin's main process there is killed with
// SIGKILL in the middle of NodeStageVolume of another volume of the same
// mode (while its mkfs runs; a pod with the node's PIDs watches for it).
// The killed container restarts in the same pod; kubelet's retry of that
// stage converges: the second pod runs, its volume is staged once, whole,
// on one device, and takes a file. The writer is untouched: the same
// checks as TestNodePluginRestartKeepsIO.
func TestKillDuringStageConverges(t *testing.T) {
	c := connect(t)
	for _, m := range attachModes {
		t.Run(m.name, func(t *testing.T) {
			w := c.startRecords(t, m, c.a)
			plugin := c.nodePlugin(t, c.a)
			restarts := containerRestarts(plugin, "spindle")

			// A pod with the node's PIDs waits for the second volume's
			// mkfs.ext4 and then kills the node plugin's main process.
			// Both wait as long as a writer may take to start: an
			// encrypted RBD stage on a loaded emulated worker outlasted
			// kubelet's 2-minute deadline before its mkfs (run S: rbd
			// calls of 10-27 s each); the retry was still under way
			// when a 3-minute wait gave up.
			c.Pod(t, w.ns, "killer", "", kube.PodOptions{Node: c.a, HostPID: true,
				Args: []string{"kill-during", "mkfs.ext4", nodePluginPattern, strconv.Itoa(int(writerStartTimeout.Seconds()))}})
			c.WaitPod(t, w.ns, "killer", corev1.PodRunning)
			_, pv := c.Claim(t, w.ns, "second", kube.ClaimOptions{StorageClass: m.class, Size: "256Mi"})
			c.Pod(t, w.ns, "second", "second", kube.PodOptions{Node: c.a, Args: []string{"write", "/data/file", "1048576"}})
			c.WaitPodWithin(t, w.ns, "killer", corev1.PodSucceeded, writerStartTimeout)
			// Its log: a privileged container's termination message came
			// back empty.
			t.Logf("%s: %s", c.a, strings.TrimSpace(c.PodLog(t, w.ns, "killer")))

			restarted := c.restartedNodePlugin(t, c.a, plugin.UID, restarts)
			c.WaitPod(t, w.ns, "second", corev1.PodRunning)
			c.WaitLogLine(t, w.ns, "second", "wrote ")
			second := pv.Spec.CSI.VolumeHandle
			staged, devices := c.stagedOn(t, c.a, second)
			if len(staged) != 1 || !strings.HasPrefix(staged[0].Device, m.device) || staged[0].MountState != "mounted" ||
				staged[0].DeviceState != "attached" || staged[0].Problem != "" {
				t.Errorf("after the retried stage %s's node plugin shows %s staged %+v; want once, mounted from a %s* device, attached, no problem",
					c.a, second, staged, m.device)
			}
			// The node's inventory lists the devices of loop volumes only.
			if len(devices) > 1 || m.name == "loop" && len(devices) != 1 {
				t.Errorf("after the retried stage %s holds %d devices of %s (%+v), want 1: the killed stage's attach was not reused", c.a, len(devices), second, devices)
			}
			w.survived(t, restarted)
		})
	}
}

func containerRestarts(pod *corev1.Pod, container string) int32 {
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == container {
			return s.RestartCount
		}
	}
	return 0
}

// restartedNodePlugin waits for the node plugin pod uid on node to have
// restarted its spindle container (more than restarts restarts) and every
// container ready, and returns it.
func (c *cluster) restartedNodePlugin(t *testing.T, node string, uid types.UID, restarts int32) *corev1.Pod {
	t.Helper()
	return c.waitNodePlugin(t, "the node plugin on "+node+" restarted and ready", node, func(p *corev1.Pod) bool {
		return p.UID == uid && containerRestarts(p, "spindle") > restarts
	})
}
