package worker

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
)

// Roles of a run's bind mounts in its receipt (messages.ReceiptMount.Role).
const (
	// MountRoleRunDir is the run's staged directory at /run/jetcrew: its
	// files (ReceiptMount.Digest covers their paths, modes and contents) and
	// the bridge's socket.
	MountRoleRunDir = "run-dir"
	// MountRoleBridge is the jetcrew-bridge binary at /opt/jetcrew/bridge;
	// its digest is the SHA-256 of the binary.
	MountRoleBridge = "bridge"
	// MountRoleWorkspace is the run's writable workspace tree at
	// /workspace (messages.WorkspaceDir); it carries no digest (the
	// snapshot's mount does).
	MountRoleWorkspace = "workspace"
	// MountRoleSnapshot is the run's workspace snapshot at
	// JailSnapshotPath, read-only; its digest is the snapshot's
	// ("sha256:<hex>", as the request names it).
	MountRoleSnapshot = "workspace-snapshot"
	// MountRoleWorkspaceTool is the jetcrew binary at JailToolPath that
	// unpacks the snapshot inside the container; its digest is the
	// SHA-256 of the binary.
	MountRoleWorkspaceTool = "workspace-tool"
	// MountRoleWorkspaceGate is the run's gate directory at JailGatePath,
	// read-only, where the worker lets `jetcrew workspace exec` go on once
	// the capture container holds the workspace; it carries no digest.
	MountRoleWorkspaceGate = "workspace-gate"
	// MountRoleOther is any other bind mount; it carries no digest.
	MountRoleOther = "bind"
)

// receiptMounts describes spec's bind mounts for a receipt by role and
// content digest, never by host path: receipts go to every reader of the
// runs bucket, and host paths name the worker's state dir and build tree.
func receiptMounts(spec ContainerSpec, plan AgentPlan) []messages.ReceiptMount {
	out := []messages.ReceiptMount{}
	for _, m := range spec.Mounts {
		rm := messages.ReceiptMount{Target: m.Target, ReadOnly: m.ReadOnly, Role: MountRoleOther}
		switch m.Target {
		case coordination.ContainerRunDir:
			rm.Role, rm.Digest = MountRoleRunDir, runDirDigest(plan)
		case coordination.BridgePath:
			rm.Role, rm.Digest = MountRoleBridge, mountDigest(m.Source)
		case messages.WorkspaceDir:
			rm.Role = MountRoleWorkspace
		case JailGatePath:
			rm.Role = MountRoleWorkspaceGate
		case JailSnapshotPath, JailToolPath:
			// Both staged files are named by their SHA-256, checked when
			// staged: "<hex>.tar" and "<hex>".
			rm.Role = MountRoleSnapshot
			if m.Target == JailToolPath {
				rm.Role = MountRoleWorkspaceTool
			}
			rm.Digest = "sha256:" + strings.TrimSuffix(filepath.Base(m.Source), ".tar")
		}
		out = append(out, rm)
	}
	return out
}

// runDirDigest returns "sha256:<hex>" over the files the plan stages in the
// run directory (path, mode, length and bytes of each, by path) and the MCP
// servers its mcp.json names.
func runDirDigest(plan AgentPlan) string {
	h := sha256.New()
	files := slices.Clone(plan.Files)
	slices.SortFunc(files, func(a, b StagedFile) int { return strings.Compare(a.Path, b.Path) })
	var n [8]byte
	for _, f := range files {
		io.WriteString(h, f.Path+"\x00"+f.Mode.String()+"\x00")
		binary.BigEndian.PutUint64(n[:], uint64(len(f.Data)))
		h.Write(n[:])
		h.Write(f.Data)
	}
	io.WriteString(h, strings.Join(plan.MCPServers, "\x00"))
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// digestCache remembers file digests by path, size and modification time:
// the bridge binary is hashed once, not once per run.
var digestCache sync.Map // digestKey → string

type digestKey struct {
	path  string
	size  int64
	mtime time.Time
}

// mountDigest returns "sha256:<hex>" of the file at path (fileDigest,
// cached), or "" when it cannot be read (the run then fails on the missing
// mount anyway).
func mountDigest(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	key := digestKey{path, fi.Size(), fi.ModTime()}
	if d, ok := digestCache.Load(key); ok {
		return d.(string)
	}
	hexSum, err := fileDigest(path)
	if err != nil {
		return ""
	}
	d := "sha256:" + hexSum
	digestCache.Store(key, d)
	return d
}
