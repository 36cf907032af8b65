package profile

import (
	"cmp"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sync"
)

// jsonKeys is the order of a profile's keys in its JSON encoding, which
// `jetcrew profiles check` prints and Digest hashes into every receipt's
// ProfileDigest: the order of the flat struct Profile was before its keys
// were grouped in facets, kept so that neither changes with the Go
// layout. A key added to a facet is added here (TestJSONKeysEveryKey).
var jsonKeys = []string{
	"name", "backend", "image", "command", "args", "prompt_stdin", "permission_mode", "approval_mode",
	"stall_timeout", "bridge_deadline", "require_bridge", "user", "home", "workdir", "network",
	"egress", "egress_inject", "egress_unmetered_paths", "egress_rate", "egress_ask", "egress_ask_timeout",
	"runtime", "memory_mib", "cpus", "pids", "tmp_mib", "home_mib",
	"workspace_mib", "git_remotes", "from_profiles", "feeds", "timeout", "env", "retries",
	"max_cost_usd", "max_output_tokens", "max_model_requests", "group_budget", "pool_budget", "on_budget", "budget_pause",
	"warm", "warm_workspace", "coordination", "max_output_mib", "env_from_host", "signed_by", "request_env",
}

// flatLayout is a struct type with one field per JSON key of a struct
// holding a Profile, in jsonKeys order (the holder's own keys after, in
// their order), and where each field is in the holder.
type flatLayout struct {
	typ   reflect.Type
	index [][]int
}

// layoutOf returns the flat layout of struct type t: its keys as
// keyFields flattens them, ordered by jsonKeys, each with its own JSON tag.
func layoutOf(t reflect.Type) flatLayout {
	rank := func(f keyField) int {
		if i := slices.Index(jsonKeys, f.jsonName()); i >= 0 {
			return i
		}
		return len(jsonKeys)
	}
	fields := keyFields(t, nil)
	slices.SortStableFunc(fields, func(a, b keyField) int { return cmp.Compare(rank(a), rank(b)) })
	var l flatLayout
	var sfs []reflect.StructField
	for _, f := range fields {
		if f.tagName("json") == "-" {
			continue
		}
		tag := f.Tag.Get("json")
		if f.tagName("json") == "" {
			tag = f.Name + tag
		}
		sfs = append(sfs, reflect.StructField{Name: fmt.Sprintf("F%d", len(sfs)), Type: f.Type, Tag: reflect.StructTag(fmt.Sprintf("json:%q", tag))})
		l.index = append(l.index, f.index)
	}
	l.typ = reflect.StructOf(sfs)
	return l
}

// jsonName returns the field's JSON key: its tag's name, else its Go name.
func (f keyField) jsonName() string { return cmp.Or(f.tagName("json"), f.Name) }

// marshal returns the JSON encoding of v, a value of the layout's holder.
func (l flatLayout) marshal(v reflect.Value) ([]byte, error) {
	flat := reflect.New(l.typ)
	for i, index := range l.index {
		flat.Elem().Field(i).Set(v.FieldByIndex(index))
	}
	return json.Marshal(flat.Interface())
}

var (
	profileLayout     = sync.OnceValue(func() flatLayout { return layoutOf(reflect.TypeFor[Profile]()) })
	descriptionLayout = sync.OnceValue(func() flatLayout { return layoutOf(reflect.TypeFor[Description]()) })
)

// MarshalJSON encodes p as one flat object, its keys in jsonKeys order.
// Digest hashes this encoding.
func (p Profile) MarshalJSON() ([]byte, error) { return profileLayout().marshal(reflect.ValueOf(p)) }

// MarshalJSON encodes d as one flat object, the profile's keys first.
// They are in jsonKeys order, the description's own after them; Profile's
// MarshalJSON, promoted, would leave those out.
func (d Description) MarshalJSON() ([]byte, error) {
	return descriptionLayout().marshal(reflect.ValueOf(d))
}
