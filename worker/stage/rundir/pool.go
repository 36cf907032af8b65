package rundir

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
	"golang.org/x/sys/unix"
)

// pool keeps the directories of finished runs that held nothing but
// mcp.json, under StateDir/p/, for later runs to take: creating a run
// directory and writing its mcp.json, then removing both, were most of a
// coordination-on run's cost in the noop benchmark (four journalled
// file-system operations per run, each slower than the run's NATS round
// trips on a busy host). A pooled directory goes back and forth by rename;
// the run's own path (Dirs.Path) exists only while the run holds it.
//
// A directory enters the pool only when nothing of its run can reach it:
// the run's container was removed (not just stopped), its session ended
// without error, and the run staged nothing in it besides mcp.json (no
// backend files, no egress socket). The container mounted it read-only, so
// mcp.json is the file the worker wrote; take checks it all the same.
//
// A directory whose run's session closed for good keeps its coordination
// socket bound (coordination.Session.CloseKeepSocket): binding a socket and
// unlinking it were the largest cost left per coordination run. The next
// session serves it (coordination.Host.ServeSocket), which first closes,
// unread, any connection the earlier run's container left waiting in its
// backlog. A pool that is nil pools nothing.
type pool struct {
	root string // StateDir/p, mode 0700
	max  int    // idle directories kept at most

	mu   sync.Mutex
	idle []pooledDir
	next int
}

// pooledDir is an idle directory and, when its session kept it, its bound
// socket (the coordination stage's, which the pool only closes).
type pooledDir struct {
	dir  string
	sock io.Closer
}

// newPool returns a pool under root keeping at most max idle
// directories. root must exist, mode 0700.
func newPool(root string, max int) *pool {
	return &pool{root: root, max: max}
}

// take moves an idle directory to dst (a run's directory, which must not
// exist) and reports whether it did, with the directory's bound socket
// (nil when it has none), now at dst/messages.SocketName; false means
// the caller stages dst itself. The run holds dst (stage.Holds) before it
// takes a directory, so a sweep never takes it for a stale one, whatever
// its times.
func (p *pool) take(dst string) (bool, io.Closer) {
	if p == nil {
		return false, nil
	}
	p.mu.Lock()
	n := len(p.idle)
	if n == 0 {
		p.mu.Unlock()
		return false, nil
	}
	d := p.idle[n-1]
	p.idle = p.idle[:n-1]
	p.mu.Unlock()
	fi, err := os.Lstat(filepath.Join(d.dir, messages.MCPConfigName))
	ok := err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() == messages.MCPConfigMode &&
		fi.Size() == mcpConfigSize && rename(d.dir, dst) == nil
	if !ok {
		d.close()
		return false, nil
	}
	return true, d.sock
}

// put moves the run directory dir into the pool, with its bound socket
// sock (nil for none), and reports whether it did; false means the caller
// closes sock and removes dir. The caller vouches that dir holds only
// mcp.json and sock's file, and that no container mounts it any more.
func (p *pool) put(dir string, sock io.Closer) bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	if len(p.idle) >= p.max {
		p.mu.Unlock()
		return false
	}
	name := filepath.Join(p.root, strconv.Itoa(p.next))
	p.next++
	p.mu.Unlock()
	if rename(dir, name) != nil {
		return false
	}
	p.mu.Lock()
	p.idle = append(p.idle, pooledDir{dir: name, sock: sock})
	p.mu.Unlock()
	return true
}

// close closes d's socket and removes d's directory.
func (d pooledDir) close() {
	if d.sock != nil {
		_ = d.sock.Close()
	}
	_ = coordination.RemoveRunDir(d.dir)
}

// drain removes every idle directory and the pool's root when it is then
// empty (the worker stops).
func (p *pool) drain() {
	if p == nil {
		return
	}
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, d := range idle {
		d.close()
	}
	_ = os.Remove(p.root)
}

// mcpConfigSize is the size of the mcp.json a pooled directory holds.
var mcpConfigSize = int64(len(coordination.MCPConfig()))

// rename moves old to new, which must not exist, in one renameat2 call
// (RENAME_NOREPLACE): os.Rename looks at new first, a system call more on
// every run that takes a pooled directory.
func rename(old, new string) error {
	return unix.Renameat2(unix.AT_FDCWD, old, unix.AT_FDCWD, new, unix.RENAME_NOREPLACE)
}
