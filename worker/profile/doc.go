// Package profile holds the operator's profiles: the recipes a run request
// selects by name (image, agent CLI, user, limits, network, egress,
// workspace size, signers), loaded from a TOML file (LoadProfiles),
// defaulted and validated once at load (Profile.Resolve), and never changed
// afterwards. A request can choose none of these.
//
// The profile file is flat (docs/profiles.md documents every key); in Go a
// Profile is its name and a set of facets, one embedded struct per
// concern, each in its own file with its keys, its defaults and parsed
// values (resolve) and its checks (validate): JailConfig (jail.go),
// AgentConfig (agent.go), WatchConfig (watch.go), CoordinationConfig
// (coordination.go), EgressConfig (egress.go), BudgetConfig (budget.go),
// WorkspaceConfig (workspace.go), WarmConfig (warm.go) and
// AdmissionConfig (admission.go). Profile.Resolve calls each, handing a
// facet the other facets' keys its rules involve. A facet's keys and
// methods are promoted to Profile, so a reader writes p.Image or
// p.HasEgress(). TOML and JSON flatten the facets; the exact-keys check
// walks them (keys.go), and MarshalJSON keeps the JSON keys in the order
// they had before the facets (json.go), which profile digests hash.
//
// Each agent CLI is a backend in its own file (backend_<name>.go): how a
// run's argv, environment and files are planned (Profile.Plan) and how its
// structured stdout is read (Parser). A backend validates the keys only it
// reads. docs/backends.md documents every backend.
package profile
