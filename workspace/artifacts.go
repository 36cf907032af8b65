package workspace

import (
	"bytes"
	"os"
	"path"

	"github.com/jetcrew/jetcrew/messages"
)

// maxArtifactFiles bounds the files of an artifacts tar.
const maxArtifactFiles = 10000

// artifacts returns a tar of the regular files under ArtifactsDir of root
// (nil when there are none) and their list. ArtifactsDir and each of its
// parents must be real directories; symlinks under it are left out, and so
// is a name holding a control character (recorded in refused, as its path
// in the workspace): artifacts are listed and fetched by name. A tar over
// max bytes (0: no bound) is an error wrapping ErrTooLarge.
func artifacts(root *os.Root, max int64, refused refusedPaths) ([]byte, []messages.ResultObject, error) {
	return dirTar(root, messages.ArtifactsDir, max, refused)
}

// dirTar is artifacts for the directory rel of root (ArtifactsDir,
// SessionDir).
func dirTar(root *os.Root, rel string, max int64, refused refusedPaths) ([]byte, []messages.ResultObject, error) {
	for p := rel; p != "."; p = path.Dir(p) {
		fi, err := root.Lstat(p)
		if err != nil || !fi.IsDir() {
			return nil, nil, nil
		}
	}
	sub, err := root.OpenRoot(rel)
	if err != nil {
		return nil, nil, nil
	}
	defer sub.Close()
	entries, err := walk(sub, "", walkOptions{maxFiles: maxArtifactFiles, refuse: func(p string) bool {
		if !hasControl(p) {
			return false
		}
		refused.add(rel + "/" + p)
		return true
	}})
	if err != nil {
		return nil, nil, err
	}
	var buf bytes.Buffer
	tw := newTarWriter(&countWriter{w: &buf, max: max})
	var list []messages.ResultObject
	for _, e := range entries {
		if !e.info.Mode().IsRegular() {
			continue
		}
		sum, err := tw.fileAs(sub, e.path, e.path, e.info)
		if err != nil {
			return nil, nil, err
		}
		list = append(list, messages.ResultObject{Name: e.path, Size: e.info.Size(), SHA256: sum})
	}
	if len(list) == 0 {
		return nil, nil, nil
	}
	if err := tw.close(); err != nil {
		return nil, nil, err
	}
	return buf.Bytes(), list, nil
}
