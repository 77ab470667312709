package driver

import (
	"encoding/base64"
	"sort"
	"strings"

	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// Page tokens name the last ID a page returned; the next page starts after
// it. Unlike an index, such a position stays meaningful when volumes are
// created or deleted between pages: nothing is returned twice, and nothing
// that existed throughout is skipped.
const pageTokenPrefix = "after:"

func encodePageToken(lastID string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(pageTokenPrefix + lastID))
}

// decodePageToken returns the ID a token starts after ("" for no token).
// A token this driver did not issue, or one naming a backend instance that
// is no longer configured, is ABORTED: the caller lists again from the start.
func (d *Driver) decodePageToken(token string) (string, error) {
	if token == "" {
		return "", nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	after, ok := strings.CutPrefix(string(raw), pageTokenPrefix)
	if err != nil || !ok {
		return "", errdefs.Busy("starting_token %q was not issued by this driver; list again from the start", token)
	}
	id, err := volumeid.Parse(after)
	if err != nil {
		return "", errdefs.Busy("starting_token %q is not a position this driver can resume from; list again from the start", token)
	}
	if _, ok := d.instances[id.InstanceKey()]; !ok {
		return "", errdefs.Busy("starting_token %q points into backend %s, which is no longer configured; list again from the start", token, id.InstanceKey())
	}
	return after, nil
}

// pageOf cuts the page after the token's position, at most maxEntries
// items, from items sorted ascending by idOf; it returns the page and the
// next token ("" on the last page).
func pageOf[T any](d *Driver, items []T, idOf func(T) string, startingToken string, maxEntries int32) ([]T, string, error) {
	if maxEntries < 0 {
		return nil, "", errdefs.InvalidArgument("max_entries must not be negative, got %d", maxEntries)
	}
	after, err := d.decodePageToken(startingToken)
	if err != nil {
		return nil, "", err
	}
	from := 0
	if after != "" {
		from = sort.Search(len(items), func(i int) bool { return idOf(items[i]) > after })
	}
	to, next := len(items), ""
	if maxEntries > 0 && from+int(maxEntries) < to {
		to = from + int(maxEntries)
		next = encodePageToken(idOf(items[to-1]))
	}
	return items[from:to], next, nil
}
