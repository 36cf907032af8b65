package stage

import "github.com/jetcrew/jetcrew/worker/live"

// Holds is the worker's registry of what is live, as one owner sees it.
// That owner is the run for a run's stages (Run.Holds), the worker for the
// stages' factories (live.Holds over live.Registry). Directories,
// volumes, cached snapshots and staged binaries are held by key (each
// stage names its keys, "volume:<name>", "dir:<path>", ...); the
// reconciler and the stages' sweepers consult it before they remove
// anything. The zero value holds into a registry of its own.
type Holds = live.Holds
