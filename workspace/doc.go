// Package workspace turns a directory into a workspace snapshot (one
// deterministic tar, named by its SHA-256), unpacks a snapshot into a run's
// directory, and captures what a run changed there as git objects: a patch,
// a bundle of the run's commits and an artifacts tar. It also fetches one
// commit of a git remote over smart HTTP (OpenRemote) into the snapshot a
// clean clone of that commit gives. Snapshots travel through two Object
// Store buckets (SnapshotStore): submitters upload to the uploads bucket
// (Submit), and workers take a snapshot's bytes into the workspace bucket
// once they hash to its digest (Fetch); presence is always decided by the
// bytes, never by an object's record.
//
// Everything here reads untrusted trees without interpreting them: files are
// reached only through an os.Root (no path, symlink or ".." leads outside the
// tree), only directories, regular files and symlinks are kept (a symlink is
// its target text, never followed), and git data is read and written with
// go-git, which runs no hooks, filters, fsmonitor or other program named by
// a repository. The snapshot format is described in docs/workspaces.md.
package workspace
