package tests

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/cdcflow/eventservice"

// TestPackageDependenciesFollowTheArchitecture checks the one-way arrows of
// the architecture with `go list -deps`: above all that the collector
// meets the service only through pkg/messaging's control plane (it must
// not link the service, the store or pebble), so it can live in another
// process.
func TestPackageDependenciesFollowTheArchitecture(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	// allowed lists what a package may link although it is under one of
	// its forbidden prefixes: the module's one clock and one back-off.
	allowed := map[string][]string{
		"pkg/pendingset": {"pkg/clock", "internal/backoff"},
		"pkg/pgnotify":   {"internal/backoff"},
	}
	for _, rule := range []struct {
		pkg       string
		forbidden []string
	}{
		{"pkg/eventcollector", []string{"pkg/eventservice", "pkg/eventstore", "pkg/pendingset", "pkg/schemastore", "pkg/upstream",
			"github.com/cockroachdb/pebble"}},
		{"pkg/messaging", []string{"pkg/eventstore", "pkg/eventservice", "pkg/eventcollector", "github.com/cockroachdb/pebble"}},
		{"pkg/eventservice", []string{"pkg/eventcollector"}},
		{"pkg/eventstore", []string{"pkg/eventservice", "pkg/eventcollector"}},
		{"pkg/schemastore", []string{"pkg/eventservice", "pkg/eventcollector"}},
		{"pkg/upstream", []string{"pkg/eventservice", "pkg/eventcollector"}},
		// pendingset is a standalone primitive: the module's one clock and
		// its one back-off are all it takes from the project.
		{"pkg/pendingset", []string{module + "/"}},
		// The PostgreSQL source feeds the store; the sink is a collector's
		// downstream and may live in a collector's process. Both are
		// production: nothing of pkg/upstream (the synthetic and test
		// sources; the source's SinkGuard is the store's).
		{"pkg/pgsource", []string{"pkg/eventservice", "pkg/eventcollector", "pkg/upstream"}},
		{"pkg/pgsink", []string{"pkg/eventservice", "pkg/eventstore", "pkg/pgsource", "pkg/upstream", "github.com/cockroachdb/pebble"}},
		{"pkg/pgcodec", []string{"pkg/eventservice", "pkg/eventstore", "pkg/eventcollector", "pkg/messaging"}},
		// The durable sink is a collector's downstream, like the memory sink.
		{"pkg/pebblesink", []string{"pkg/eventservice", "pkg/eventstore", "pkg/pendingset", "pkg/upstream"}},
		// Seed 001's publisher stays separable from the scheduler: of the
		// module it links only the pending set, the clock and the back-off.
		{"pkg/pgnotify", []string{"pkg/common", "pkg/messaging", "pkg/eventstore", "pkg/eventservice", "pkg/eventcollector",
			"pkg/upstream", "pkg/schemastore", "pkg/pgsource", "pkg/pgsink", "pkg/pgcodec", "pkg/remote", "internal/", "cmd/"}},
		// The wire carries messages; the store stays on the service's side.
		{"pkg/remote", []string{"pkg/eventstore", "github.com/cockroachdb/pebble"}},
		{"pkg/common", []string{module + "/"}},
		{"pkg/clock", []string{module + "/"}},
		// serve, status, compare and remove are production: they link
		// neither the synthetic server nor its sources.
		{"cmd/cdcserver/app/replicate", []string{"pkg/upstream", "cmd/cdcserver/app/synthetic"}},
	} {
		out, err := exec.Command(goTool, "list", "-deps", module+"/"+rule.pkg).CombinedOutput()
		require.NoError(t, err, "%s", out)
		deps := strings.Fields(string(out))
		for _, dep := range deps {
			if dep == module+"/"+rule.pkg || slices.Contains(allowed[rule.pkg], strings.TrimPrefix(dep, module+"/")) {
				continue
			}
			for _, f := range rule.forbidden {
				if !strings.Contains(f, ".") {
					f = module + "/" + f
				}
				require.False(t, strings.HasPrefix(dep, f), "%s depends on %s (forbidden: %s)", rule.pkg, dep, f)
			}
		}
		if rule.pkg == "pkg/eventcollector" {
			require.True(t, slices.Contains(deps, module+"/pkg/messaging"), "the collector speaks messaging's protocol")
		}
	}
}

// TestFloorsRunOneWay checks the house's floors with `go list -deps`:
// internal/ is the ground floor (leaf helpers and test kits, importing
// nothing of the module's library or programs), pkg/ is the library and
// links only internal/'s leaf helpers (never a test kit, never the
// programs), and cmd/ (the cdcserver program and its app/ packages) sits on
// top. An arrow back down-up (pkg/ importing the server, a helper
// importing pkg/) is how the first layout ended with 6 arrows running up.
func TestFloorsRunOneWay(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	deps := func(pattern string) []string {
		out, err := exec.Command(goTool, "list", "-deps", module+"/"+pattern).CombinedOutput()
		require.NoError(t, err, "%s", out)
		return strings.Fields(string(out))
	}
	leaves := []string{"internal/backoff", "internal/dueheap", "internal/latency", "internal/optcheck", "internal/pgdial", "internal/pglink", "internal/promutil", "internal/slots", "internal/touchahead", "internal/wirereader"}
	library := deps("pkg/...")
	require.Contains(t, library, module+"/pkg/eventservice", "the walk listed the library")
	for _, dep := range library {
		rel, ours := strings.CutPrefix(dep, module+"/")
		if !ours {
			continue
		}
		require.False(t, strings.HasPrefix(rel, "cmd/"), "the library links the program's %s", rel)
		if strings.HasPrefix(rel, "internal/") {
			require.True(t, slices.Contains(leaves, rel), "the library links %s, which is not a leaf helper (%v)", rel, leaves)
		}
	}
	for _, dep := range deps("internal/...") {
		rel, ours := strings.CutPrefix(dep, module+"/")
		require.False(t, ours && !strings.HasPrefix(rel, "internal/"), "internal/ links %s: it is the ground floor", rel)
	}
}

// TestOnlyTheSyntheticServerImportsUpstream checks with `go list` that of
// the module's packages only cmd/cdcserver/app/synthetic imports
// pkg/upstream, outside test files: it holds the synthetic and test sources
// (the generator, Manual), which the synthetic server, tests and benchmarks
// use. What a production upstream needs of it (SinkGuard, once) lives in
// pkg/eventstore, so pkg/pgsource and everything serve links stay off it.
func TestOnlyTheSyntheticServerImportsUpstream(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	// Imports, not TestImports or XTestImports: tests and benchmarks may.
	out, err := exec.Command(goTool, "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"/...").CombinedOutput()
	require.NoError(t, err, "%s", out)
	allowed := []string{module + "/cmd/cdcserver/app/synthetic"}
	var importers []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if slices.Contains(fields[1:], module+"/pkg/upstream") {
			importers = append(importers, fields[0])
		}
	}
	require.Equal(t, allowed, importers, "pkg/upstream is the synthetic server's, the tests' and the benchmarks' only")
}

// TestCommandsUseTheExitCodePackage reads cmd/'s source: its exit statuses
// are cmd/cdcserver/app/exitcode's, with what each means per command
// documented there, so no other package of cmd/ declares a constant or a
// variable named exit... (serve's exitStopped and the synthetic server's
// ExitBadFlags, which serve borrowed, were two sets), no os.Exit takes a
// number, and in package main, whose functions that return an int return
// an exit status (a command's runner, parseFlags), no return gives a
// number.
func TestCommandsUseTheExitCodePackage(t *testing.T) {
	_, self, _, ok := runtime.Caller(0)
	require.True(t, ok)
	root := filepath.Join(filepath.Dir(self), "..")
	var found []string
	files := 0
	isInt := func(l *ast.FieldList) bool {
		if l == nil || len(l.List) == 0 {
			return false
		}
		id, ok := l.List[0].Type.(*ast.Ident)
		return ok && id.Name == "int"
	}
	isNumber := func(e ast.Expr) bool {
		lit, ok := e.(*ast.BasicLit)
		return ok && lit.Kind == token.INT
	}
	err := filepath.WalkDir(filepath.Join(root, "cmd"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if filepath.Dir(rel) == filepath.Join("cmd", "cdcserver", "app", "exitcode") {
			return nil
		}
		files++
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		at := func(n ast.Node) string { return rel + ":" + strconv.Itoa(fset.Position(n.Pos()).Line) }
		for _, decl := range f.Decls {
			if g, ok := decl.(*ast.GenDecl); ok && (g.Tok == token.CONST || g.Tok == token.VAR) {
				for _, sp := range g.Specs {
					for _, n := range sp.(*ast.ValueSpec).Names {
						if strings.HasPrefix(strings.ToLower(n.Name), "exit") {
							found = append(found, at(n)+": declares "+n.Name)
						}
					}
				}
			}
		}
		// The int-returning functions of package main, by their bodies.
		var exitFuncs []*ast.BlockStmt
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				if f.Name.Name == "main" && n.Body != nil && isInt(n.Type.Results) {
					exitFuncs = append(exitFuncs, n.Body)
				}
			case *ast.FuncLit:
				if f.Name.Name == "main" && isInt(n.Type.Results) {
					exitFuncs = append(exitFuncs, n.Body)
				}
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Exit" && len(n.Args) == 1 && isNumber(n.Args[0]) {
					if x, ok := sel.X.(*ast.Ident); ok && x.Name == "os" {
						found = append(found, at(n)+": os.Exit of a number")
					}
				}
			}
			return true
		})
		for _, body := range exitFuncs {
			ast.Inspect(body, func(n ast.Node) bool {
				if _, ok := n.(*ast.FuncLit); ok {
					return false // checked on its own if it returns an int
				}
				if r, ok := n.(*ast.ReturnStmt); ok && len(r.Results) > 0 && isNumber(r.Results[0]) {
					found = append(found, at(r)+": returns a number as an exit status")
				}
				return true
			})
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, files, 20, "the walk read cmd/'s source")
	require.Empty(t, found, "exit statuses outside cmd/cdcserver/app/exitcode: use its constants")
}
