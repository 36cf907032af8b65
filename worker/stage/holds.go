package stage

import "github.com/jetcrew/jetcrew/worker/live"

// Holds is what a stage holds what it uses in: the worker's registry of
// what is live (live.Registry) as one owner sees it, the run for a run's
// stages (Run.Holds), the worker for the stages' factories. Directories,
// volumes, cached snapshots and staged binaries are held by key (each
// stage names its keys, "volume:<name>", "dir:<path>", ...); the
// reconciler and the stages' sweepers consult it before they remove
// anything. The zero value holds into a registry of its own.
type Holds = live.Holds
