package workspace

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/go-git/go-git/v5/plumbing"
)

// cacheFormat is the version of the cache's entries: an entry of another
// version (an earlier jetcrew's: its pack held every object) is not used.
const cacheFormat = 2

// cacheMeta is the small part of a cached .git: its format (cacheFormat),
// the pack's checksum (empty for a .git without a pack), the commit count
// and the loose objects.
type cacheMeta struct {
	Format  int      `json:"format"`
	PackSum string   `json:"pack_sum"`
	Commits int      `json:"commits"`
	Loose   []string `json:"loose,omitempty"`
}

// loadCache fills gd's pack, index, index file and loose object files from
// cacheDir's entry for gd.head and the repository's loose objects lo, and
// reports whether it found a whole one (the pack's trailer must match its
// checksum, and every loose object listed must still be in lo).
func (gd *gitDir) loadCache(cacheDir string, lo *looseDir) bool {
	base := filepath.Join(cacheDir, gd.head)
	var meta cacheMeta
	b, err := os.ReadFile(base + ".json")
	if err != nil || json.Unmarshal(b, &meta) != nil || meta.Format != cacheFormat {
		return false
	}
	index, err := os.ReadFile(base + ".index")
	if err != nil {
		return false
	}
	var pack, idx []byte
	if meta.PackSum != "" {
		if pack, idx = loadCachedPack(base, meta.PackSum); pack == nil {
			return false
		}
	}
	var loose []looseFile
	if len(meta.Loose) > 0 {
		if loose = loadLoose(lo, meta.Loose); loose == nil {
			return false
		}
	}
	gd.pack, gd.idx, gd.index, gd.packSum, gd.commits, gd.loose = pack, idx, index, meta.PackSum, meta.Commits, loose
	return true
}

// loadCachedPack returns the cached pack and index at base whose checksum
// is sum, or nils.
func loadCachedPack(base, sum string) (pack, idx []byte) {
	pack, err1 := os.ReadFile(base + ".pack")
	idx, err2 := os.ReadFile(base + ".idx")
	if err1 != nil || err2 != nil || len(pack) < 32 {
		return nil, nil
	}
	got := sha1.Sum(pack[:len(pack)-20])
	if !bytes.Equal(got[:], pack[len(pack)-20:]) || hex.EncodeToString(got[:]) != sum {
		return nil, nil
	}
	return pack, idx
}

// loadLoose reads the loose object files names (hex hashes) from lo, or
// returns nil when one is missing or unreadable.
func loadLoose(lo *looseDir, names []string) []looseFile {
	if lo == nil {
		return nil
	}
	hashes := make([]plumbing.Hash, 0, len(names))
	for _, n := range names {
		b, err := hex.DecodeString(n)
		if err != nil || len(b) != len(plumbing.ZeroHash) {
			return nil
		}
		hashes = append(hashes, plumbing.Hash(b))
	}
	files, rest, err := lo.readFiles(hashes, -1)
	if err != nil || len(rest) > 0 {
		return nil
	}
	return files
}

// saveCache writes gd's entry into cacheDir, each file through a temporary
// one renamed into place. A failure only loses the cache.
func (gd *gitDir) saveCache(cacheDir string) {
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return
	}
	m := cacheMeta{Format: cacheFormat, PackSum: gd.packSum, Commits: gd.commits}
	for _, f := range gd.loose {
		m.Loose = append(m.Loose, f.hash.String())
	}
	meta, _ := json.Marshal(m)
	base := filepath.Join(cacheDir, gd.head)
	files := map[string][]byte{".index": gd.index, ".json": meta}
	if gd.packSum != "" {
		files[".pack"], files[".idx"] = gd.pack, gd.idx
	}
	// The .json is written last: an entry is only read through it.
	for _, ext := range []string{".pack", ".idx", ".index", ".json"} {
		data, ok := files[ext]
		if !ok {
			continue
		}
		tmp := base + ext + ".tmp"
		if os.WriteFile(tmp, data, 0o600) != nil || os.Rename(tmp, base+ext) != nil {
			_ = os.Remove(tmp)
			return
		}
	}
}
