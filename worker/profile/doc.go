// Package profile holds the operator's profiles: the recipes a run request
// selects by name (image, agent CLI, user, limits, network, egress,
// workspace size, signers), loaded from a TOML file (LoadProfiles),
// defaulted and validated once at load (Profile.Resolve), and never changed
// afterwards. A request can choose none of these.
//
// Each agent CLI is a backend in its own file (backend_<name>.go): how a
// run's argv, environment and files are planned (Profile.Plan) and how its
// structured stdout is read (Parser). A backend validates the keys only it
// reads. docs/profiles.md documents every key and docs/backends.md every
// backend.
package profile
