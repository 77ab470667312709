package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/spindle-csi/spindle/internal/backend"
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

// BackendConfig is one backend instance: its type, its name and the
// section named after its type, which the backend's registered Kind
// decodes (internal/backend.Register).
type BackendConfig struct {
	Type string
	Name string
	// Section is the decoded section of the instance's type, once
	// Validate (or LoadFile) has checked it.
	Section *backend.Section
	// sections are the sections as read, by key (one, named after the
	// type, in a valid file).
	sections map[string]json.RawMessage
}

// Key is "<type>/<name>".
func (b BackendConfig) Key() string { return b.Type + "/" + b.Name }

// UnmarshalJSON reads type, name and the sections; Validate decodes the
// section of the type and refuses the others.
func (b *BackendConfig) UnmarshalJSON(data []byte) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return err
	}
	*b = BackendConfig{sections: map[string]json.RawMessage{}}
	for k, v := range fields {
		var err error
		switch k {
		case "type":
			err = json.Unmarshal(v, &b.Type)
		case "name":
			err = json.Unmarshal(v, &b.Name)
		default:
			b.sections[k] = v
		}
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	return nil
}

// MarshalJSON writes the instance as the config file has it.
func (b BackendConfig) MarshalJSON() ([]byte, error) {
	out := map[string]any{"type": b.Type, "name": b.Name}
	for k, v := range b.sections {
		out[k] = v
	}
	if b.Section != nil {
		out[b.Type] = b.Section
	}
	return json.Marshal(out)
}

// decode checks the sections and decodes the one of the instance's type.
func (b *BackendConfig) decode(where string) []error {
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(b.sections)) {
		if k != b.Type {
			errs = append(errs, fmt.Errorf("%s: section %q does not belong to type %q", where, k, b.Type))
		}
	}
	raw, ok := b.sections[b.Type]
	if !ok {
		if !slices.Contains(backend.Types(), b.Type) {
			return append(errs, fmt.Errorf("%s.type %q: unknown backend type (known: %s)", where, b.Type, strings.Join(backend.Types(), ", ")))
		}
		return append(errs, fmt.Errorf("%s: type %s needs its section %q", where, b.Type, b.Type))
	}
	sec, err := backend.DecodeSection(b.Type, raw)
	if err != nil {
		return append(errs, fmt.Errorf("%s.%s: %w", where, b.Type, err))
	}
	b.Section = sec
	return append(errs, sec.Validate(where+"."+b.Type)...)
}

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

// DefaultFile is the configuration without --config: one loop instance
// "default" serving loopPoolDir.
func DefaultFile(loopPoolDir string) (*File, error) {
	section, err := json.Marshal(map[string]string{"poolDir": loopPoolDir})
	if err != nil {
		return nil, err
	}
	f := &File{Backends: []BackendConfig{{Type: "loop", Name: "default", sections: map[string]json.RawMessage{"loop": section}}}}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return f, nil
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
		errs = append(errs, f.Backends[i].decode(where)...)
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
