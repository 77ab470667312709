package rbd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// The cluster map: ceph-csi's config.json, a JSON list of clusters by
// cluster ID with their monitors and, for RBD, a RADOS namespace. Rook
// writes it as the ConfigMap rook-ceph-csi-config (key
// csi-cluster-config-json) and rewrites it whenever it moves a monitor;
// kubelet updates a mounted ConfigMap in place. So the file is read again
// on every call to the cluster, never cached: the next RPC after Rook's
// rewrite, on any node and on the controller, uses the new monitors
// without a restart. The file is a few hundred bytes; a call to the
// cluster forks a process.

// clusterEntry is one cluster of the map. Fields Spindle does not use
// (Rook's namespace, cephFS, nfs, readAffinity, ...) are ignored.
type clusterEntry struct {
	ClusterID string   `json:"clusterID"`
	Monitors  []string `json:"monitors"`
	// RadosNamespace at the top level is where ceph-csi read it before
	// its "rbd" section existed; rbd.radosNamespace wins.
	RadosNamespace string `json:"radosNamespace"`
	RBD            struct {
		RadosNamespace string `json:"radosNamespace"`
	} `json:"rbd"`
}

// namespace is the cluster's RADOS namespace for RBD images ("" for none).
func (e *clusterEntry) namespace() string {
	if e.RBD.RadosNamespace != "" {
		return e.RBD.RadosNamespace
	}
	return e.RadosNamespace
}

// readClusterMap reads the map at path. A file that does not exist is an
// empty map: the ConfigMap may not exist yet (the chart mounts it
// optionally), and the instance's own cluster can still be configured.
func readClusterMap(path string) ([]clusterEntry, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the cluster map %s: %w", path, err)
	}
	if strings.TrimSpace(string(b)) == "" {
		return nil, nil
	}
	var entries []clusterEntry
	if err := json.Unmarshal(b, &entries); err != nil {
		return nil, fmt.Errorf("the cluster map %s is not ceph-csi's config.json (a JSON list of {clusterID, monitors, ...}): %w", path, err)
	}
	return entries, nil
}

// lookupCluster returns the map's entry for cluster id, nil when the map
// does not list it.
func lookupCluster(path, id string) (*clusterEntry, error) {
	entries, err := readClusterMap(path)
	if err != nil {
		return nil, err
	}
	for i := range entries {
		if entries[i].ClusterID == id {
			return &entries[i], nil
		}
	}
	return nil, nil
}

// clusterIDs lists the cluster IDs of the map (for messages).
func clusterIDs(path string) []string {
	entries, _ := readClusterMap(path)
	ids := make([]string, 0, len(entries))
	for _, e := range entries {
		ids = append(ids, e.ClusterID)
	}
	slices.Sort(ids)
	return ids
}

// endpoint is how to reach one cluster now: its monitors (none when the
// config file names them) and the RADOS namespace the map gives it.
type endpoint struct {
	monitors  []string
	namespace string
}

// endpointOf resolves cluster id: the cluster map first (it follows the
// monitors as they move), else the instance's own monitors for its own
// cluster. A cluster neither names is a precondition failure: the volume
// or StorageClass names a cluster this driver is not configured for.
func (c *cluster) endpointOf(id string) (endpoint, error) {
	e, err := lookupCluster(c.cfg.ClusterMap, id)
	if err != nil {
		if id != c.cfg.ClusterID || (len(c.cfg.Monitors) == 0 && c.cfg.ConfigFile == "") {
			return endpoint{}, errdefs.Wrap(errdefs.ErrUnavailable, err, "cluster %s", id)
		}
		e = nil // the own cluster is still reachable through the config
	}
	if e != nil {
		if len(e.Monitors) == 0 {
			return endpoint{}, errdefs.Precondition("cluster %s has no monitors in the cluster map %s", id, c.cfg.ClusterMap)
		}
		for _, m := range e.Monitors {
			if !monitorRe.MatchString(m) || strings.Contains(m, ",") {
				return endpoint{}, errdefs.Precondition("cluster %s: %q in the cluster map %s is not a monitor address (host:port or v2:host:port)", id, m, c.cfg.ClusterMap)
			}
		}
		if ns := e.namespace(); ns != "" && !namespaceRe.MatchString(ns) {
			return endpoint{}, errdefs.Precondition("cluster %s: radosNamespace %q in the cluster map %s is not a namespace name Spindle uses (letters, digits, '.', '_', '-')", id, ns, c.cfg.ClusterMap)
		}
		return endpoint{monitors: e.Monitors, namespace: e.namespace()}, nil
	}
	if id == c.cfg.ClusterID {
		if len(c.cfg.Monitors) == 0 && c.cfg.ConfigFile == "" {
			return endpoint{}, errdefs.Precondition("cluster %s has no monitors: the backend config names none, and the cluster map%s does not list it", id, mapName(c.cfg.ClusterMap))
		}
		return endpoint{monitors: c.cfg.Monitors}, nil
	}
	known := append([]string{c.cfg.ClusterID}, clusterIDs(c.cfg.ClusterMap)...)
	return endpoint{}, errdefs.Precondition("cluster ID %q is neither this rbd backend's own nor in its cluster map%s (known: %s)", id, mapName(c.cfg.ClusterMap), strings.Join(known, ", "))
}

func mapName(path string) string {
	if path == "" {
		return " (none configured)"
	}
	return " " + path
}

// knowsCluster reports whether id is the instance's own cluster or one of
// its cluster map; a map that cannot be read is ErrUnavailable naming it,
// never "unknown cluster" (the cause would be lost).
func (c *cluster) knowsCluster(id string) (bool, error) {
	if id == c.cfg.ClusterID {
		return true, nil
	}
	e, err := lookupCluster(c.cfg.ClusterMap, id)
	if err != nil {
		return false, errdefs.Wrap(errdefs.ErrUnavailable, err, "cluster %s", id)
	}
	return e != nil, nil
}
