package worker

// SubjectStopPrefix prefixes the internal request a worker sends to the
// worker holding a run to stop it, jetcrew.ctl.stop.<run_id>; only workers
// publish and subscribe to it (package roles grants it).
const SubjectStopPrefix = subjectStopPrefix
