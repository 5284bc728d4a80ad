package tests

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// libraryFiles parses every non-test Go file of pkg/ and calls visit with
// its path relative to the module's root.
func libraryFiles(t *testing.T, visit func(rel string, fset *token.FileSet, f *ast.File)) {
	t.Helper()
	_, self, _, ok := runtime.Caller(0)
	require.True(t, ok)
	module := filepath.Join(filepath.Dir(self), "..")
	files := 0
	err := filepath.WalkDir(filepath.Join(module, "pkg"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		files++
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(module, path)
		visit(rel, fset, f)
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, files, 50, "the walk read the library's source")
}

// wallClock is what reads the wall clock or waits on it in package time.
var wallClock = map[string]bool{"Now": true, "Since": true, "Until": true, "After": true, "AfterFunc": true,
	"NewTimer": true, "NewTicker": true, "Tick": true, "Sleep": true}

// TestLibraryReadsTimeThroughItsClock reads the library's source: outside
// pkg/clock nothing calls time.Now, Since, Until, After, AfterFunc,
// NewTimer, NewTicker, Tick or Sleep. Decisions (cadences, timeouts, TTLs,
// lag) go through the injected clock.Clock, so a fake clock drives them in
// tests and an embedder's clock in production; a latency metric times real
// work with clock.Stopwatch, and an operating-system deadline comes from
// clock.RealDeadline. A time.Now in the scan path, the collector and the
// replication stream once bypassed the clock embedders inject.
func TestLibraryReadsTimeThroughItsClock(t *testing.T) {
	var found []string
	libraryFiles(t, func(rel string, fset *token.FileSet, f *ast.File) {
		if filepath.Dir(rel) == filepath.Join("pkg", "clock") {
			return
		}
		timeName := ""
		for _, imp := range f.Imports {
			if path, _ := strconv.Unquote(imp.Path.Value); path == "time" {
				timeName = "time"
				if imp.Name != nil {
					timeName = imp.Name.Name
				}
			}
		}
		if timeName == "" {
			return
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == timeName && wallClock[sel.Sel.Name] {
				found = append(found, rel+":"+strconv.Itoa(fset.Position(sel.Pos()).Line)+": time."+sel.Sel.Name)
			}
			return true
		})
	})
	require.Empty(t, found, "wall-clock reads in pkg/: use the injected clock.Clock (decisions), clock.Stopwatch (latency metrics) or clock.RealDeadline (OS deadlines)")
}

// TestLibraryGoroutinesRunInWaitGroups reads the library's source: no go
// statement in pkg/ outside tests. Every goroutine starts through a
// sync.WaitGroup (its Go method) owned by what Close or Stop waits on, so
// none outlives its owner; a bare go statement is how the room watcher
// once ran outside its target's wait group.
func TestLibraryGoroutinesRunInWaitGroups(t *testing.T) {
	var found []string
	libraryFiles(t, func(rel string, fset *token.FileSet, f *ast.File) {
		ast.Inspect(f, func(n ast.Node) bool {
			if g, ok := n.(*ast.GoStmt); ok {
				found = append(found, rel+":"+strconv.Itoa(fset.Position(g.Pos()).Line))
			}
			return true
		})
	})
	require.Empty(t, found, "go statements in pkg/: start them with a WaitGroup's Go, owned by what Close waits on")
}

// TestLibraryNeverAssignsPackageVariables reads the library's source: a
// package-level variable of pkg/ is a sentinel error, an interface
// assertion or a table written once where it is declared, and no function
// assigns to it, to an element or a field of it, or increments it. State
// lives in what a constructor returns, so two services (or a test's two
// stores) in one process never share it. An identifier that resolves to a
// local declaration is not taken for the package's.
func TestLibraryNeverAssignsPackageVariables(t *testing.T) {
	type file struct {
		rel string
		fs  *token.FileSet
		f   *ast.File
	}
	byDir := map[string][]file{}
	libraryFiles(t, func(rel string, fset *token.FileSet, f *ast.File) {
		byDir[filepath.Dir(rel)] = append(byDir[filepath.Dir(rel)], file{rel, fset, f})
	})
	var found []string
	for _, files := range byDir {
		vars := map[string]bool{}
		for _, fl := range files {
			for _, d := range fl.f.Decls {
				if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.VAR {
					for _, sp := range g.Specs {
						for _, n := range sp.(*ast.ValueSpec).Names {
							if n.Name != "_" {
								vars[n.Name] = true
							}
						}
					}
				}
			}
		}
		// root is the variable an assignment's target starts from: x in
		// x, x[i], x.f, *x.
		var root func(ast.Expr) *ast.Ident
		root = func(e ast.Expr) *ast.Ident {
			switch e := e.(type) {
			case *ast.Ident:
				return e
			case *ast.IndexExpr:
				return root(e.X)
			case *ast.SelectorExpr:
				return root(e.X)
			case *ast.StarExpr:
				return root(e.X)
			case *ast.ParenExpr:
				return root(e.X)
			}
			return nil
		}
		for _, fl := range files {
			local := func(id *ast.Ident) bool {
				if id.Obj == nil {
					return false // declared in another file of the package
				}
				vs, ok := id.Obj.Decl.(*ast.ValueSpec)
				if !ok {
					return true // a parameter, a := or a range variable
				}
				for _, d := range fl.f.Decls {
					if g, ok := d.(*ast.GenDecl); ok && slices.Contains(g.Specs, ast.Spec(vs)) {
						return false
					}
				}
				return true
			}
			check := func(e ast.Expr, pos token.Pos) {
				if id := root(e); id != nil && vars[id.Name] && !local(id) {
					found = append(found, fl.rel+":"+strconv.Itoa(fl.fs.Position(pos).Line)+" "+id.Name)
				}
			}
			for _, d := range fl.f.Decls {
				fn, ok := d.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				ast.Inspect(fn.Body, func(n ast.Node) bool {
					switch n := n.(type) {
					case *ast.AssignStmt:
						if n.Tok != token.DEFINE {
							for _, l := range n.Lhs {
								check(l, n.Pos())
							}
						}
					case *ast.IncDecStmt:
						check(n.X, n.Pos())
					}
					return true
				})
			}
		}
	}
	require.Empty(t, found, "package-level variables assigned in pkg/: keep state in what a constructor returns")
}
