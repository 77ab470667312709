package rbd

import (
	"context"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
)

// Fencing: the publish to the new node blocklists the lost node's client,
// never the Ceph manager's (which had the image open at that moment for a
// background task), then waits until the OSDs have dropped the watch (the
// second status still shows it: the OSD has not seen the new map yet)
// before it records the attachment, so the new node's watcher check passes.
func TestFenceWaitsForTheWatchToGo(t *testing.T) {
	const watched = `{"watchers":[{"address":"10.0.0.7:0/3411306950","client":4152,"cookie":1},{"address":"10.0.0.1:0/2511446081","client":4120,"cookie":2}]}`
	status := func() *commandtest.Step {
		return commandtest.Expect("rbd", with("status", "kube/"+testImage, "--format", "json")...)
	}
	mgrDump := func() *commandtest.Step {
		return commandtest.Expect("ceph", with("mgr", "dump", "--format", "json")...).Prints(mgrDumpOutput)
	}
	script := commandtest.New(t,
		commandtest.Expect("rbd", with("info", "kube/"+testImage, "--format", "json")...).
			Prints(`{"name":"`+testImage+`","size":4194304,"features":["layering"]}`),
		commandtest.Expect("rbd", with("image-meta", "list", "kube/"+testImage, "--format", "json")...).
			Prints(`{"spindle.name":"pvc-1","spindle.volume":"{\"accessType\":\"mount\",\"fsType\":\"ext4\"}"}`),
		status().Prints(watched),
		mgrDump(),
		commandtest.Expect("ceph", with("osd", "blocklist", "add", "10.0.0.7:0/3411306950")...),
		status().Prints(watched),
		mgrDump(),
		status().Prints(`{"watchers":[]}`),
		commandtest.Expect("rbd", with("image-meta", "set", "kube/"+testImage, "spindle.attachments",
			`[{"nodeID":"node-b","accessMode":"SINGLE_NODE_WRITER","readOnly":false,"since":"0001-01-01T00:00:00Z"}]`)...),
	)
	cfg := Config{ClusterID: "c", Monitors: []string{"10.0.0.1:3300"}, Pool: "kube", UserID: "csi", KeyFile: "/etc/spindle/ceph.key", Fencing: true}.withDefaults()
	c := &cluster{cfg: cfg, run: command.New(script, nil)}
	inst := newInstance("a", c, map[string]mapper{MounterKRBD: &kernelMapper{c: c, sysRoot: t.TempDir()}})
	if _, err := inst.Exporter.Publish(context.Background(), "kube/"+testImage, backend.Attachment{NodeID: "node-b", AccessMode: backend.SingleNodeWriter}); err != nil {
		t.Fatal(err)
	}
}
