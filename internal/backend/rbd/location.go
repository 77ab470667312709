package rbd

import (
	"regexp"
	"strings"

	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Where an image lives. An instance serves its own cluster (Config.ClusterID)
// and the clusters of its cluster map (ceph-csi's config.json, clustermap.go),
// any pool of them and any RADOS namespace of a pool: a StorageClass picks
// them with ceph-csi's parameters clusterID, pool and radosNamespace
// (params.go). The image ID, the part of a volume or snapshot ID after
// "rbd/<instance>/", carries all of it, so every RPC on every node finds
// the image from the ID alone:
//
//	<pool>/<image>                        the instance's own cluster, no namespace
//	                                      (every ID earlier versions gave)
//	<cluster>/<pool>/<image>              any cluster, no namespace
//	<cluster>/<pool>/<namespace>/<image>  any cluster, in a RADOS namespace
//
// The shortest form that says it is the one given; the longer ones are
// read whatever cluster they name.

// location is a pool, or a RADOS namespace of one, in a cluster.
type location struct {
	cluster   string // a cluster ID: the instance's own or one of its cluster map
	pool      string
	namespace string // "" for the pool's default namespace
}

// poolSpec is the rbd CLI's pool spec: "pool" or "pool/namespace".
func (l location) poolSpec() string {
	if l.namespace == "" {
		return l.pool
	}
	return l.pool + "/" + l.namespace
}

// cephPool is the location's pool (namespace) as the Ceph client names it.
func (l location) cephPool() ceph.PoolSpec {
	return ceph.PoolSpec{Pool: l.pool, Namespace: l.namespace}
}

// String names the location for messages: "cluster/pool[/namespace]".
func (l location) String() string { return l.cluster + "/" + l.poolSpec() }

// ref names one image.
type ref struct {
	location
	image string
}

// spec is the rbd CLI's image spec: "pool[/namespace]/image".
func (r ref) spec() string { return r.poolSpec() + "/" + r.image }

// cephImage is the image as the Ceph client names it.
func (r ref) cephImage() ceph.ImageSpec { return r.location.cephPool().Image(r.image) }

// at is the spec of one of the image's snapshots.
func (r ref) at(snap string) string { return r.spec() + "@" + snap }

// ref is the image called image in the location.
func (l location) ref(image string) ref { return ref{location: l, image: image} }

var (
	namespaceRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)
	// imageNameRe: the image names Spindle gives and accepts from outside
	// (static volumes, adopted ones): a segment of a volume ID.
	imageNameRe = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$`)
)

// idOf is r's image ID as the instance whose own cluster is own gives it.
func (r ref) idOf(own string) string {
	switch {
	case r.cluster == own && r.namespace == "":
		return r.pool + "/" + r.image
	case r.namespace == "":
		return r.cluster + "/" + r.pool + "/" + r.image
	default:
		return r.cluster + "/" + r.pool + "/" + r.namespace + "/" + r.image
	}
}

// parseRef reads an image ID (any of the three forms) of the instance
// whose own cluster is own. An ID of another shape names no image the
// instance could hold: ErrNotFound, naming what. Whether the cluster it
// names is known is checked when it is reached (clustermap.go).
func parseRef(id, own, what string) (ref, error) {
	segs := strings.Split(id, "/")
	var r ref
	switch len(segs) {
	case 2:
		r = ref{location: location{cluster: own, pool: segs[0]}, image: segs[1]}
	case 3:
		r = ref{location: location{cluster: segs[0], pool: segs[1]}, image: segs[2]}
	case 4:
		r = ref{location: location{cluster: segs[0], pool: segs[1], namespace: segs[2]}, image: segs[3]}
	default:
		return ref{}, errdefs.NotFound("%s %s does not exist: an rbd image ID is <pool>/<image>, <cluster>/<pool>/<image> or <cluster>/<pool>/<namespace>/<image>", what, id)
	}
	if !clusterIDRe.MatchString(r.cluster) || !poolRe.MatchString(r.pool) || (r.namespace != "" && !namespaceRe.MatchString(r.namespace)) || !imageNameRe.MatchString(r.image) {
		return ref{}, errdefs.NotFound("%s %s does not exist: its cluster, pool, namespace or image name is not one Spindle uses", what, id)
	}
	return r, nil
}
