package multinode

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/spindle-csi/spindle/e2e/kube"
)

// killDuringMkfs is the shell the test runs on a worker (workers.sh exec):
// it waits for an mkfs.ext4 to start and then kills the node plugin's main
// process (the spindle process running --mode=node, not the attach
// daemon's) with SIGKILL, so that the kill lands inside NodeStageVolume,
// between the attach and the mount. It prints what it killed, or exits 1
// when no mkfs.ext4 ran within its time.
const killDuringMkfs = `for i in $(seq 1 3000); do
  if m=$(pgrep -x mkfs.ext4); then
    for p in $(pgrep -x spindle); do
      if tr '\0' ' ' </proc/$p/cmdline | grep -q -- ' --mode=node '; then
        kill -KILL $p && echo "killed $p during mkfs.ext4 $m: $(tr '\0' ' ' </proc/$m/cmdline 2>/dev/null)"
        exit 0
      fi
    done
  fi
  sleep 0.05
done
echo "no mkfs.ext4 ran in 150 s"
exit 1`

// TestKillDuringStageConverges, per attach mode: a records writer runs on
// worker a while the node plugin's main process there is killed with
// SIGKILL in the middle of NodeStageVolume of another volume of the same
// mode (while its mkfs runs). The killed container restarts in the same
// pod; kubelet's retry of that stage converges: the second pod runs, its
// volume is staged once, whole, on one device, and takes a file. The
// writer is untouched: the same checks as TestNodePluginRestartKeepsIO.
func TestKillDuringStageConverges(t *testing.T) {
	c := connect(t)
	script := workersScript(t)
	for _, m := range attachModes {
		t.Run(m.name, func(t *testing.T) {
			w := c.startRecords(t, m)
			plugin := c.nodePlugin(t, c.a)
			restarts := containerRestarts(plugin, "spindle")

			killed := make(chan string, 1)
			go func() {
				out, err := exec.Command(script, "exec", c.a, killDuringMkfs).CombinedOutput()
				if err != nil {
					killed <- fmt.Sprintf("FAILED: %v: %s", err, out)
					return
				}
				killed <- strings.TrimSpace(string(out))
			}()
			// The guest picks the script up within a second (worker-guest.sh
			// polls its exec directory); the stage starts seconds later.
			time.Sleep(3 * time.Second)
			_, pv := c.Claim(t, w.ns, "second", kube.ClaimOptions{StorageClass: m.class, Size: "256Mi"})
			c.Pod(t, w.ns, "second", "second", kube.PodOptions{Node: c.a, Args: []string{"write", "/data/file", "1048576"}})
			var what string
			select {
			case what = <-killed:
			case <-time.After(6 * time.Minute):
				t.Fatalf("the kill on %s did not report in 6 minutes", c.a)
			}
			if !strings.HasPrefix(what, "killed ") {
				t.Fatalf("the node plugin on %s was not killed mid-stage: %s", c.a, what)
			}
			t.Logf("%s: %s", c.a, what)

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
			if len(devices) != 1 {
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
