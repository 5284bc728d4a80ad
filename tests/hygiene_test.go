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

// TestLibraryGoroutinesRunInWaitGroups reads the library's source: no go
// statement in pkg/ outside tests. Every goroutine starts through a
// sync.WaitGroup (its Go method) owned by what Close or Stop waits on, so
// none outlives its owner; a bare go statement is how the room watcher
// once ran outside its target's wait group.
func TestLibraryGoroutinesRunInWaitGroups(t *testing.T) {
	_, self, _, ok := runtime.Caller(0)
	require.True(t, ok)
	root := filepath.Join(filepath.Dir(self), "..", "pkg")
	var found []string
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		files++
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if g, ok := n.(*ast.GoStmt); ok {
				rel, _ := filepath.Rel(root, path)
				found = append(found, filepath.Join("pkg", rel)+":"+strconv.Itoa(fset.Position(g.Pos()).Line))
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, files, 50, "the walk read the library's source")
	require.Empty(t, found, "go statements in pkg/: start them with a WaitGroup's Go, owned by what Close waits on")
}
