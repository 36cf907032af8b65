package warm

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/jetcrew/jetcrew/worker/profile"
)

// Binding says when a warm container takes the value of a profile field.
// A container is made before its run exists, so every field is one of
// three kinds: made into the container, read from the run's own profile
// when it claims the container, or never part of a run's container. The
// model is agent-sandbox's warm pools, whose containers kept a template's
// old values after it changed (kubernetes-sigs/agent-sandbox#1047).
type Binding int

const (
	// Fixed (jail-fixed) is a field the container is made with: its spec
	// (image, user, limits, network, OCI runtime, the tmpfs at /tmp and
	// HOME), its mounts and its workspace volume's size. A container made
	// with another value is never handed the run (Pool.Claim), and a
	// reload that changes the value replaces the pool (Pool.Reload).
	Fixed Binding = iota + 1
	// Late (bound late) is a field the run's stages, its hand-off or the
	// worker's watch of the run read from the run's own profile when the
	// run claims a container (argv, environment, secrets, egress, budgets,
	// timeouts): a container made with another value serves the run as a
	// cold one of the run's profile would, and a reload keeps the pool.
	Late
	// Irrelevant is a field that decides whether a request is admitted or
	// how many containers a pool keeps, never what a run's container is or
	// gets: a reload keeps the pool (and resizes it, for warm and
	// warm_workspace).
	Irrelevant
)

// String returns "fixed", "late" or "irrelevant".
func (b Binding) String() string {
	switch b {
	case Fixed:
		return "fixed"
	case Late:
		return "late"
	case Irrelevant:
		return "irrelevant"
	}
	return "unclassified"
}

// bindings classifies every field of profile.Profile by its TOML key (its
// JSON name for name, which has none). A field missing here counts as
// Fixed; TestEveryProfileFieldClassified fails until it is added.
var bindings = map[string]Binding{
	// The container's label, its pool's key.
	"name": Fixed,
	// The container's spec (runner.ProfileSpec) and HOME.
	"image": Fixed, "user": Fixed, "home": Fixed, "network": Fixed, "runtime": Fixed,
	"memory_mib": Fixed, "cpus": Fixed, "pids": Fixed, "tmp_mib": Fixed, "home_mib": Fixed,
	// The size of the workspace volume a warm_workspace container is made
	// with (Config.Make).
	"workspace_mib": Fixed,
	// The launcher the container waits in is the bridge coordination
	// mounts.
	"coordination": Fixed,

	// The run's argv, environment and working directory: its hand-off
	// (messages.Handoff), its run directory's files (the backend's plan).
	"backend": Late, "command": Late, "args": Late, "prompt_stdin": Late,
	"permission_mode": Late, "approval_mode": Late, "env": Late, "workdir": Late,
	// The secrets stage's env file, read by the launcher the run's argv
	// names.
	"env_from_host": Late,
	// The egress stage's proxy, opened for the run on a socket in its
	// directory, and its environment.
	"egress": Late, "egress_inject": Late, "egress_ask": Late, "egress_ask_timeout": Late,
	// The egress stage's metering: the requests that pass unmetered, and
	// the pace of each injected key.
	"egress_unmetered_paths": Late, "egress_rate": Late,
	// The egress stage's budgets.
	"max_cost_usd": Late, "max_output_tokens": Late, "max_model_requests": Late,
	"group_budget": Late, "pool_budget": Late, "on_budget": Late, "budget_pause": Late,
	// The worker's watch of the run and its outcome.
	"timeout": Late, "stall_timeout": Late, "bridge_deadline": Late, "require_bridge": Late,
	"max_output_mib": Late, "retries": Late,

	// Admission of a request, and of its workspace's source.
	"signed_by": Irrelevant, "request_env": Irrelevant,
	"git_remotes": Irrelevant, "from_profiles": Irrelevant, "feeds": Irrelevant,
	// How many containers the pools keep (Pool.plan).
	"warm": Irrelevant, "warm_workspace": Irrelevant,
}

// Bindings returns the binding of every profile field, by TOML key.
func Bindings() map[string]Binding { return maps.Clone(bindings) }

// profileField is one field of profile.Profile: its key and its index
// path (through embedded structs).
type profileField struct {
	key   string
	index []int
}

// fixedFields are the fields of profile.Profile that FixedDiff compares:
// the Fixed ones and any not classified.
var fixedFields = sync.OnceValue(func() []profileField {
	var out []profileField
	for _, f := range fieldsOf(reflect.TypeFor[profile.Profile](), nil) {
		if b, ok := bindings[f.key]; !ok || b == Fixed {
			out = append(out, f)
		}
	}
	return out
})

// fieldsOf returns the exported fields of struct type t, the fields of
// embedded structs in their place, each keyed by FieldKey.
func fieldsOf(t reflect.Type, at []int) []profileField {
	var out []profileField
	for i := range t.NumField() {
		f := t.Field(i)
		index := append(slices.Clip(at), i)
		switch {
		case f.Anonymous && f.Type.Kind() == reflect.Struct:
			out = append(out, fieldsOf(f.Type, index)...)
		case f.IsExported():
			out = append(out, profileField{key: FieldKey(f), index: index})
		}
	}
	return out
}

// FieldKey returns the key of a field of profile.Profile: its TOML key,
// else (name, whose TOML key is its table's) its JSON name, else its Go
// name.
func FieldKey(f reflect.StructField) string {
	for _, tag := range []string{"toml", "json"} {
		if name, _, _ := strings.Cut(f.Tag.Get(tag), ","); name != "" && name != "-" {
			return name
		}
	}
	return f.Name
}

// FixedDiff returns the keys of the Fixed fields (and of any field not
// classified) whose values differ between profiles a and b, in field
// order: empty when a container made for a serves a run of b as one made
// for b would.
func FixedDiff(a, b *profile.Profile) []string {
	va, vb := reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem()
	var diff []string
	for _, f := range fixedFields() {
		if !reflect.DeepEqual(va.FieldByIndex(f.index).Interface(), vb.FieldByIndex(f.index).Interface()) {
			diff = append(diff, f.key)
		}
	}
	return diff
}
