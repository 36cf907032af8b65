package workspace

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
)

// cacheMeta is the small part of a cached .git: the pack's checksum and
// the commit count.
type cacheMeta struct {
	PackSum string `json:"pack_sum"`
	Commits int    `json:"commits"`
}

// loadCache fills gd's pack, index and index file from cacheDir's entry for
// gd.head, and reports whether it found a whole one (the pack's trailer
// must match its checksum).
func (gd *gitDir) loadCache(cacheDir string) bool {
	base := filepath.Join(cacheDir, gd.head)
	var meta cacheMeta
	b, err := os.ReadFile(base + ".json")
	if err != nil || json.Unmarshal(b, &meta) != nil {
		return false
	}
	pack, err1 := os.ReadFile(base + ".pack")
	idx, err2 := os.ReadFile(base + ".idx")
	index, err3 := os.ReadFile(base + ".index")
	if err1 != nil || err2 != nil || err3 != nil || len(pack) < 32 {
		return false
	}
	sum := sha1.Sum(pack[:len(pack)-20])
	if !bytes.Equal(sum[:], pack[len(pack)-20:]) || hex.EncodeToString(sum[:]) != meta.PackSum {
		return false
	}
	gd.pack, gd.idx, gd.index, gd.packSum, gd.commits = pack, idx, index, meta.PackSum, meta.Commits
	return true
}

// saveCache writes gd's entry into cacheDir, each file through a temporary
// one renamed into place. A failure only loses the cache.
func (gd *gitDir) saveCache(cacheDir string) {
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return
	}
	meta, _ := json.Marshal(cacheMeta{PackSum: gd.packSum, Commits: gd.commits})
	base := filepath.Join(cacheDir, gd.head)
	for ext, data := range map[string][]byte{".pack": gd.pack, ".idx": gd.idx, ".index": gd.index, ".json": meta} {
		tmp := base + ext + ".tmp"
		if os.WriteFile(tmp, data, 0o600) != nil || os.Rename(tmp, base+ext) != nil {
			_ = os.Remove(tmp)
			return
		}
	}
}
