package runner_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/stage/bridge"
	"github.com/jetcrew/jetcrew/worker/stage/coord"
	"github.com/jetcrew/jetcrew/worker/stage/proxy"
	"github.com/jetcrew/jetcrew/worker/stage/rundir"
	"github.com/jetcrew/jetcrew/worker/stage/secrets"
	"github.com/jetcrew/jetcrew/worker/stage/stall"
	"github.com/jetcrew/jetcrew/worker/stage/tree"
)

// stageDir is package stage's directory, the stage packages below it.
const stageDir = "../stage"

// hooks are the stage contract's hook interfaces, by name.
var hooks = map[string]reflect.Type{
	"Prestarter":     reflect.TypeFor[stage.Prestarter](),
	"Poststarter":    reflect.TypeFor[stage.Poststarter](),
	"Adopter":        reflect.TypeFor[stage.Adopter](),
	"Checker":        reflect.TypeFor[stage.Checker](),
	"MCPObserver":    reflect.TypeFor[stage.MCPObserver](),
	"AnswerObserver": reflect.TypeFor[stage.AnswerObserver](),
	"Exiter":         reflect.TypeFor[stage.Exiter](),
	"Noter":          reflect.TypeFor[stage.Noter](),
	"Releaser":       reflect.TypeFor[stage.Releaser](),
}

// stageTypes are the stage types a run's list is built from (stages.go),
// by their package's directory under worker/stage.
var stageTypes = map[string]reflect.Type{
	"bridge":  reflect.TypeFor[*bridge.Stage](),
	"coord":   reflect.TypeFor[*coord.Stage](),
	"proxy":   reflect.TypeFor[*proxy.Stage](),
	"rundir":  reflect.TypeFor[*rundir.Stage](),
	"secrets": reflect.TypeFor[*secrets.Stage](),
	"stall":   reflect.TypeFor[*stall.Stage](),
	"tree":    reflect.TypeFor[*tree.Stage](),
}

// TestStageHooksImplemented holds each stage package's compile-time
// assertions (`var _ stage.X = (*T)(nil)`) to exactly the hooks its stage
// type implements: a hook a stage gains without declaring it, or a
// declaration the compiler would accept for a type that no longer means
// it, fails here. The hook list is the contract's (every interface of
// package stage that embeds Stage), and every stage package is listed.
func TestStageHooksImplemented(t *testing.T) {
	t.Parallel()
	require.ElementsMatch(t, contractHooks(t), slices.Collect(maps.Keys(hooks)),
		"the hooks of worker/stage's contract (interfaces embedding Stage)")
	require.ElementsMatch(t, stagePackages(t), slices.Collect(maps.Keys(stageTypes)),
		"every stage package under worker/stage has its stage type in stageTypes")
	for pkg, typ := range stageTypes {
		var implemented []string
		for name, h := range hooks {
			if typ.Implements(h) {
				implemented = append(implemented, name)
			}
		}
		require.NotEmpty(t, implemented, "%s implements no hook", typ)
		declared := declaredHooks(t, filepath.Join(stageDir, pkg), typ.Elem().Name())
		require.ElementsMatch(t, implemented, declared,
			"worker/stage/%s declares (var _ stage.X = (*%s)(nil)) exactly the hooks %s implements", pkg, typ.Elem().Name(), typ)
	}
}

// parseDir parses the non-test Go files of dir.
func parseDir(t *testing.T, dir string) []*ast.File {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	var files []*ast.File
	fset := token.NewFileSet()
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		files = append(files, f)
	}
	require.NotEmpty(t, files, "no Go files in %s", dir)
	return files
}

// contractHooks returns the names of package stage's interfaces that embed
// Stage: its hooks.
func contractHooks(t *testing.T) []string {
	t.Helper()
	var names []string
	for _, f := range parseDir(t, stageDir) {
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			if it, ok := ts.Type.(*ast.InterfaceType); ok && slices.ContainsFunc(it.Methods.List, func(m *ast.Field) bool {
				id, ok := m.Type.(*ast.Ident)
				return len(m.Names) == 0 && ok && id.Name == "Stage"
			}) {
				names = append(names, ts.Name.Name)
			}
			return false
		})
	}
	return names
}

// stagePackages returns the directories under worker/stage holding a
// stage package (internal, which holds none, excepted).
func stagePackages(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(stageDir)
	require.NoError(t, err)
	var pkgs []string
	for _, e := range entries {
		if e.IsDir() && e.Name() != "internal" && e.Name() != "testdata" {
			pkgs = append(pkgs, e.Name())
		}
	}
	return pkgs
}

// declaredHooks returns the hooks the non-test files of dir declare type
// typeName implements: each `_ stage.X = (*typeName)(nil)` of a var
// declaration whose X is a hook.
func declaredHooks(t *testing.T, dir, typeName string) []string {
	t.Helper()
	var declared []string
	for _, f := range parseDir(t, dir) {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if len(vs.Names) != 1 || vs.Names[0].Name != "_" || len(vs.Values) != 1 {
					continue
				}
				sel, ok := vs.Type.(*ast.SelectorExpr)
				if !ok || !isIdent(sel.X, "stage") || hooks[sel.Sel.Name] == nil || !isNilPointerOf(vs.Values[0], typeName) {
					continue
				}
				declared = append(declared, sel.Sel.Name)
			}
		}
	}
	return declared
}

// isNilPointerOf reports whether e is `(*typeName)(nil)`.
func isNilPointerOf(e ast.Expr, typeName string) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok || len(call.Args) != 1 || !isIdent(call.Args[0], "nil") {
		return false
	}
	paren, ok := call.Fun.(*ast.ParenExpr)
	if !ok {
		return false
	}
	star, ok := paren.X.(*ast.StarExpr)
	return ok && isIdent(star.X, typeName)
}

// isIdent reports whether e is the identifier name.
func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}
