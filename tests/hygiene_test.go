package tests

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"runtime"
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
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
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
