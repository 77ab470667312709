package filestore

import (
	"context"
	"errors"

	"github.com/spindle-csi/spindle/internal/backend"
)

// errPending marks the store operations being built (issue 3); this file
// goes away when they land.
var errPending = errors.New("not implemented yet")

// List implements backend.ImageStore.
func (s *Store) List(context.Context) ([]*backend.Image, error) { return nil, errPending }

// Expand implements backend.ImageStore.
func (s *Store) Expand(context.Context, string, int64) (*backend.Image, error) {
	return nil, errPending
}

// Modify implements backend.ImageStore.
func (s *Store) Modify(context.Context, string, map[string]string) (*backend.Image, error) {
	return nil, errPending
}

// Capacity implements backend.ImageStore.
func (s *Store) Capacity(context.Context) (backend.Capacity, error) {
	return backend.Capacity{}, errPending
}
