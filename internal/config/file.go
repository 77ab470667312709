package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"

	"github.com/spindle-csi/spindle/internal/backend/iscsi"
	"github.com/spindle-csi/spindle/internal/backend/loop"
	"github.com/spindle-csi/spindle/internal/backend/rbd"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// File is the backend configuration (--config), as the Helm chart renders it:
//
//	defaultBackend: loop/default
//	backends:
//	  - type: loop
//	    name: default
//	    loop:
//	      poolDir: /var/lib/spindle/pools/default
//	  - type: iscsi
//	    name: san
//	    iscsi:
//	      poolDir: /var/lib/spindle/pools/san
//	      portals: ["192.0.2.10:3260"]
//	      targetPrefix: iqn.2026-01.dev.spindle
//	      initiatorPrefix: iqn.2026-01.dev.spindle.node
type File struct {
	// DefaultBackend ("<type>/<name>") serves StorageClasses that name no
	// backend; the first backend when empty.
	DefaultBackend string          `json:"defaultBackend,omitempty"`
	Backends       []BackendConfig `json:"backends"`
}

// BackendConfig is one backend instance; exactly the section of its type is set.
type BackendConfig struct {
	Type  string        `json:"type"`
	Name  string        `json:"name"`
	Loop  *loop.Config  `json:"loop,omitempty"`
	ISCSI *iscsi.Config `json:"iscsi,omitempty"`
	RBD   *rbd.Config   `json:"rbd,omitempty"`
}

// Key is "<type>/<name>".
func (b BackendConfig) Key() string { return b.Type + "/" + b.Name }

// LoadFile reads and validates a config file. Unknown fields are errors, so
// a typo never silently falls back to a default.
func LoadFile(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var f File
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return &f, nil
}

// DefaultFile is the configuration without --config: one loop instance.
func DefaultFile(loopPoolDir string) *File {
	return &File{Backends: []BackendConfig{{Type: loop.Type, Name: "default", Loop: &loop.Config{PoolDir: loopPoolDir}}}}
}

// Validate checks the configuration and reports every problem.
func (f *File) Validate() error {
	var errs []error
	if len(f.Backends) == 0 {
		errs = append(errs, errors.New("no backends configured"))
	}
	seen := map[string]bool{}
	for i, b := range f.Backends {
		where := fmt.Sprintf("backends[%d]", i)
		if err := volumeid.ValidateInstanceName(b.Name); err != nil {
			errs = append(errs, fmt.Errorf("%s.name: %w", where, err))
		}
		if seen[b.Key()] {
			errs = append(errs, fmt.Errorf("%s: %s is configured twice", where, b.Key()))
		}
		seen[b.Key()] = true
		if b.Type != loop.Type && b.Loop != nil {
			errs = append(errs, fmt.Errorf("%s: a loop section does not belong to type %q", where, b.Type))
		}
		if b.Type != iscsi.Type && b.ISCSI != nil {
			errs = append(errs, fmt.Errorf("%s: an iscsi section does not belong to type %q", where, b.Type))
		}
		if b.Type != rbd.Type && b.RBD != nil {
			errs = append(errs, fmt.Errorf("%s: an rbd section does not belong to type %q", where, b.Type))
		}
		switch b.Type {
		case iscsi.Type:
			if b.ISCSI == nil {
				errs = append(errs, fmt.Errorf("%s: type iscsi needs an iscsi section", where))
				break
			}
			for _, err := range b.ISCSI.Validate() {
				errs = append(errs, fmt.Errorf("%s.iscsi.%w", where, err))
			}
		case loop.Type:
			if b.Loop == nil {
				errs = append(errs, fmt.Errorf("%s: type loop needs a loop section", where))
				break
			}
			if !filepath.IsAbs(b.Loop.PoolDir) {
				errs = append(errs, fmt.Errorf("%s.loop.poolDir %q: must be an absolute path", where, b.Loop.PoolDir))
			}
			if b.Loop.MaxProvisionedBytes < 0 {
				errs = append(errs, fmt.Errorf("%s.loop.maxProvisionedBytes: must not be negative", where))
			}
		case rbd.Type:
			if b.RBD == nil {
				errs = append(errs, fmt.Errorf("%s: type rbd needs an rbd section", where))
				break
			}
			errs = append(errs, b.RBD.Validate(where+".rbd")...)
		default:
			errs = append(errs, fmt.Errorf("%s.type %q: unknown backend type (known: loop, iscsi, rbd)", where, b.Type))
		}
	}
	if f.DefaultBackend != "" && !seen[f.DefaultBackend] {
		errs = append(errs, fmt.Errorf("defaultBackend %q is not one of the configured backends", f.DefaultBackend))
	}
	return errors.Join(errs...)
}

// Default returns the key of the default backend.
func (f *File) Default() string {
	if f.DefaultBackend != "" {
		return f.DefaultBackend
	}
	return f.Backends[0].Key()
}
