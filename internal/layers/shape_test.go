package layers

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Bounds of the production code's shape (issue 37): a type that outgrows
// them has taken on a second concern, and a reader can no longer find one
// concern in one place.
const (
	maxMethods   = 30  // methods of one type
	maxFields    = 35  // fields of one struct
	maxFuncLines = 80  // lines of one function, its signature and braces included
	maxFileLines = 600 // lines of one file
)

// boundedTypes are the trees whose types keep to maxMethods and maxFields.
// messages is not among them: its structs are the wire format, one field
// per documented key.
var boundedTypes = []string{"worker/...", "coordination/...", "egress/...", "dispatcher/...", "console/...", "cmd/...", "workspace/..."}

// shape is what the production code's shape check finds over its bounds.
type shape struct {
	methods map[string]int // "pkg.Type" → methods
	over    []string
}

// measure walks the module's production Go files under root (no tests,
// no testdata, no end-to-end tests or benchmarks) and reports every type,
// function and file over its bound.
func measure(t *testing.T, root string) []string {
	t.Helper()
	fset := token.NewFileSet()
	s := shape{methods: map[string]int{}}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && rel != "." || rel == "tests" || rel == "bench" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		s.file(fset, filepath.ToSlash(rel), f)
		return nil
	})
	require.NoError(t, err)
	for typ, n := range s.methods {
		if n > maxMethods {
			s.over = append(s.over, fmt.Sprintf("type %s has %d methods (bound %d)", typ, n, maxMethods))
		}
	}
	return s.over
}

// file measures one file: its length, its functions' lengths, its
// structs' fields, and counts its methods by receiver.
func (s *shape) file(fset *token.FileSet, rel string, f *ast.File) {
	pkg := filepath.ToSlash(filepath.Dir(rel))
	if n := fset.File(f.Pos()).LineCount(); n > maxFileLines {
		s.over = append(s.over, fmt.Sprintf("file %s has %d lines (bound %d)", rel, n, maxFileLines))
	}
	bounded := matchAny(boundedTypes, pkg)
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			name := d.Name.Name
			if recv := receiver(d); recv != "" {
				name = recv + "." + name
				if bounded {
					s.methods[pkg+"."+recv]++
				}
			}
			if n := fset.Position(d.End()).Line - fset.Position(d.Pos()).Line + 1; n > maxFuncLines {
				s.over = append(s.over, fmt.Sprintf("func %s (%s) has %d lines (bound %d)", name, rel, n, maxFuncLines))
			}
		case *ast.GenDecl:
			if !bounded {
				continue
			}
			for _, spec := range d.Specs {
				ts, ok := spec.(*ast.TypeSpec)
				if !ok {
					continue
				}
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					continue
				}
				n := 0
				for _, fl := range st.Fields.List {
					n += max(1, len(fl.Names))
				}
				if n > maxFields {
					s.over = append(s.over, fmt.Sprintf("type %s.%s has %d fields (bound %d)", pkg, ts.Name.Name, n, maxFields))
				}
			}
		}
	}
}

// receiver returns the name of d's receiver type, "" for a function.
func receiver(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return ""
	}
	t := d.Recv.List[0].Type
	if star, ok := t.(*ast.StarExpr); ok {
		t = star.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// TestShape fails when the production code outgrows its bounds: a type
// under the worker, the coordination and egress libraries or the client
// facades with more than maxMethods methods or maxFields fields, a
// function over maxFuncLines lines, a file over maxFileLines lines.
func TestShape(t *testing.T) {
	t.Parallel()
	require.Empty(t, measure(t, "../.."), "over the shape's bounds")
}

// TestShapeCatch proves the check can fail: a generated package with one
// type over each bound, a long function and a long file is reported on
// each count.
func TestShapeCatch(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "worker", "big")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	var b strings.Builder
	b.WriteString("package big\n\ntype T struct {\n")
	for i := range maxFields + 1 {
		b.WriteString("\tf" + strconv.Itoa(i) + " int\n")
	}
	b.WriteString("}\n\n")
	for i := range maxMethods + 1 {
		b.WriteString("func (T) M" + strconv.Itoa(i) + "() {}\n")
	}
	b.WriteString("\nfunc long() {\n")
	for range maxFuncLines {
		b.WriteString("\t_ = 0\n")
	}
	b.WriteString("}\n")
	for range maxFileLines {
		b.WriteString("\n")
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "big.go"), []byte(b.String()), 0o644))
	// A test file of any size is not production code.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "big_test.go"), []byte(b.String()), 0o644))
	got := measure(t, root)
	require.Len(t, got, 4, "%q", got)
	joined := strings.Join(got, "\n")
	for _, want := range []string{"type worker/big.T has 31 methods", "type worker/big.T has 36 fields", "func long (worker/big/big.go) has 82 lines", "file worker/big/big.go has"} {
		require.Contains(t, joined, want)
	}
}
