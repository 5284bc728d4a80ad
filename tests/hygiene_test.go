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
	files := goFiles(t, "pkg", false, visit)
	require.Greater(t, files, 50, "the walk read the library's source")
}

// goFiles parses the Go files under the module's directory root (its test
// files too if tests), calls visit with each one's path relative to the
// module's root, and returns how many it read.
func goFiles(t *testing.T, root string, tests bool, visit func(rel string, fset *token.FileSet, f *ast.File)) int {
	t.Helper()
	_, self, _, ok := runtime.Caller(0)
	require.True(t, ok)
	module := filepath.Join(filepath.Dir(self), "..")
	files := 0
	err := filepath.WalkDir(filepath.Join(module, root), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || (!tests && strings.HasSuffix(path, "_test.go")) {
			return err
		}
		files++
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(module, path)
		visit(filepath.ToSlash(rel), fset, f)
		return nil
	})
	require.NoError(t, err)
	return files
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

// notConverted excuses, check by check, the files (or directories) of
// pkg/ that issue 57's "one habit each" has not reached yet: pkg/pgsource
// and pkg/pgsink, converted by their own engineers, and pkg/upstream's
// SinkGuard, on its way to pkg/eventstore. An entry that no longer
// excuses anything fails its check: remove it, so that the list only
// shrinks.
var notConverted = map[string][]string{}

// habitCheck collects a check's findings, setting aside those that
// notConverted excuses, and fails on the rest and on stale excuses.
type habitCheck struct {
	t       *testing.T
	name    string
	found   []string
	excused map[string]bool
}

func newHabitCheck(t *testing.T, name string) *habitCheck {
	return &habitCheck{t: t, name: name, excused: map[string]bool{}}
}

// add records a finding at rel:line.
func (c *habitCheck) add(rel string, line int, what string) {
	for _, ex := range notConverted[c.name] {
		if rel == ex || strings.HasPrefix(rel, ex+"/") {
			c.excused[ex] = true
			return
		}
	}
	c.found = append(c.found, rel+":"+strconv.Itoa(line)+": "+what)
}

// done fails t on the findings (msg says what to do instead) and on every
// excuse that excused nothing.
func (c *habitCheck) done(msg string) {
	c.t.Helper()
	require.Empty(c.t, c.found, msg)
	for _, ex := range notConverted[c.name] {
		require.True(c.t, c.excused[ex], "%s is excused from the %q check but keeps its habit now: remove it from notConverted", ex, c.name)
	}
}

// receiverType is the name of a method's receiver type (T for T, *T,
// T[K, V]), or "" for a function.
func receiverType(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return ""
	}
	e := fn.Recv.List[0].Type
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	switch x := e.(type) {
	case *ast.IndexExpr:
		e = x.X
	case *ast.IndexListExpr:
		e = x.X
	}
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// TestOptionsHaveOneSpelling reads the library's source: every exported
// ...Options struct of pkg/ has an exported Validate() error, and fills its
// defaults (if it has any) in EnsureDefaults, a method on the value that
// returns the filled copy (opts = opts.EnsureDefaults()), pebble's
// spelling; no type has withDefaults, WithDefaults, ensureDefaults,
// applyDefaults or a validate beside them. Four spellings once said the
// same thing in four packages.
func TestOptionsHaveOneSpelling(t *testing.T) {
	c := newHabitCheck(t, "options")
	otherSpellings := map[string]bool{"withDefaults": true, "WithDefaults": true, "ensureDefaults": true,
		"applyDefaults": true, "fillDefaults": true, "defaults": true, "setDefaults": true}
	type options struct {
		rel                   string
		line                  int
		validate, defaultsBad bool
	}
	optionTypes := map[string]*options{} // by directory and name
	type method struct {
		rel  string
		line int
		fn   *ast.FuncDecl
	}
	var methods []method
	libraryFiles(t, func(rel string, fset *token.FileSet, f *ast.File) {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					if ts, ok := sp.(*ast.TypeSpec); ok && ts.Name.IsExported() && strings.HasSuffix(ts.Name.Name, "Options") {
						if _, ok := ts.Type.(*ast.StructType); ok {
							optionTypes[filepath.Dir(rel)+"."+ts.Name.Name] = &options{rel: rel, line: fset.Position(ts.Pos()).Line}
						}
					}
				}
			case *ast.FuncDecl:
				if otherSpellings[d.Name.Name] {
					c.add(rel, fset.Position(d.Pos()).Line, d.Name.Name+": spell it EnsureDefaults")
				}
				methods = append(methods, method{rel, fset.Position(d.Pos()).Line, d})
			}
		}
	})
	require.NotEmpty(t, optionTypes)
	for _, m := range methods {
		o := optionTypes[filepath.Dir(m.rel)+"."+receiverType(m.fn)]
		if o == nil {
			continue
		}
		_, pointer := m.fn.Recv.List[0].Type.(*ast.StarExpr)
		results := m.fn.Type.Results
		switch m.fn.Name.Name {
		case "Validate":
			o.validate = results != nil && len(results.List) == 1 && len(m.fn.Type.Params.List) == 0
		case "EnsureDefaults":
			if pointer || results == nil || len(results.List) != 1 {
				c.add(m.rel, m.line, receiverType(m.fn)+".EnsureDefaults: a method on the value returning the filled copy")
			}
		case "validate":
			c.add(m.rel, m.line, receiverType(m.fn)+".validate: spell it Validate")
		}
	}
	for name, o := range optionTypes {
		if !o.validate {
			c.add(o.rel, o.line, name+" has no Validate() error")
		}
	}
	c.done("options: EnsureDefaults() T on the value, Validate() error")
}

// TestSentinelErrorsLiveInErrorsGo reads the library's source: a
// package-level Err... variable of pkg/ (a sentinel that callers test with
// errors.Is) is declared in its package's errors.go, so one file lists
// every error a package can return.
func TestSentinelErrorsLiveInErrorsGo(t *testing.T) {
	c := newHabitCheck(t, "errors")
	libraryFiles(t, func(rel string, fset *token.FileSet, f *ast.File) {
		if filepath.Base(rel) == "errors.go" {
			return
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, sp := range g.Specs {
				for _, n := range sp.(*ast.ValueSpec).Names {
					if strings.HasPrefix(n.Name, "Err") {
						c.add(rel, fset.Position(n.Pos()).Line, n.Name)
					}
				}
			}
		}
	})
	c.done("sentinel errors outside errors.go in pkg/: move them to the package's errors.go")
}

// TestTestSeamsAreTestingKnobs reads the library's source: a test hook of
// pkg/ is a field of the component's testingKnobs struct (see
// pkg/eventservice/knobs.go), not a ...ForTesting identifier nor an
// unexported field of an exported Options struct, which an embedder sees
// documented beside the real options and tests set by reaching past the
// API.
func TestTestSeamsAreTestingKnobs(t *testing.T) {
	c := newHabitCheck(t, "knobs")
	knobs := 0
	libraryFiles(t, func(rel string, fset *token.FileSet, f *ast.File) {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.Ident:
				if strings.Contains(strings.ToLower(n.Name), "fortesting") {
					c.add(rel, fset.Position(n.Pos()).Line, n.Name+": make it a field of testingKnobs")
				}
			case *ast.TypeSpec:
				if n.Name.Name == "testingKnobs" {
					knobs++
				}
				st, ok := n.Type.(*ast.StructType)
				if !ok || !n.Name.IsExported() || !strings.HasSuffix(n.Name.Name, "Options") {
					return true
				}
				for _, fl := range st.Fields.List {
					for _, name := range fl.Names {
						if !name.IsExported() {
							c.add(rel, fset.Position(name.Pos()).Line, n.Name.Name+"."+name.Name+": a test hook in Options; make it a field of testingKnobs")
						}
					}
				}
			}
			return true
		})
	})
	require.GreaterOrEqual(t, knobs, 5, "the walk found the testingKnobs structs")
	c.done("test seams in pkg/: fields of the component's testingKnobs")
}

// TestTestsNeitherParseStacksNorSleepNorUseEventually reads the tests of
// pkg/, internal/ and cmd/ (and tests/ for Eventually): no test tells
// goroutines or tickers apart by parsing a stack (runtime.Stack,
// runtime.Callers: a testingKnobs hook says it), none sleeps except in a
// testing/synctest bubble (where a sleep is how time moves), and a poll
// for a condition goes through internal/testwait, not testify's
// Eventually, so that every wait has one spelling and one deadline policy.
func TestTestsNeitherParseStacksNorSleepNorUseEventually(t *testing.T) {
	stack, sleep, eventually := newHabitCheck(t, "stack"), newHabitCheck(t, "sleep"), newHabitCheck(t, "eventually")
	visit := func(rel string, fset *token.FileSet, f *ast.File) {
		if !strings.HasSuffix(rel, "_test.go") {
			return
		}
		names := map[string]string{} // local name -> import path
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			name := filepath.Base(path)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			names[name] = path
		}
		// bubbles are the function literals run by synctest.Test.
		bubbles := map[*ast.FuncLit]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok && len(call.Args) == 2 {
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Test" {
					if x, ok := sel.X.(*ast.Ident); ok && names[x.Name] == "testing/synctest" {
						if fl, ok := call.Args[1].(*ast.FuncLit); ok {
							bubbles[fl] = true
						}
					}
				}
			}
			return true
		})
		var path []ast.Node
		ast.Inspect(f, func(n ast.Node) bool {
			if n == nil {
				path = path[:len(path)-1]
				return true
			}
			path = append(path, n)
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			x, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			line := fset.Position(sel.Pos()).Line
			switch pkg := names[x.Name]; {
			case pkg == "runtime" && (sel.Sel.Name == "Stack" || sel.Sel.Name == "Callers" || sel.Sel.Name == "CallersFrames") && !strings.HasPrefix(rel, "tests/"):
				stack.add(rel, line, "runtime."+sel.Sel.Name)
			case pkg == "time" && sel.Sel.Name == "Sleep" && !strings.HasPrefix(rel, "tests/"):
				inBubble := false
				for _, p := range path {
					if fl, ok := p.(*ast.FuncLit); ok && bubbles[fl] {
						inBubble = true
					}
				}
				if !inBubble {
					sleep.add(rel, line, "time.Sleep")
				}
			case (strings.HasSuffix(pkg, "testify/require") || strings.HasSuffix(pkg, "testify/assert")) &&
				(sel.Sel.Name == "Eventually" || sel.Sel.Name == "Eventuallyf" || sel.Sel.Name == "EventuallyWithT"):
				eventually.add(rel, line, x.Name+"."+sel.Sel.Name)
			}
			return true
		})
	}
	for _, root := range []string{"pkg", "internal", "cmd", "tests"} {
		goFiles(t, root, true, visit)
	}
	stack.done("stack parsing in tests: tell goroutines apart by a testingKnobs hook")
	sleep.done("time.Sleep in tests: wait on a signal, poll with internal/testwait, or move time in a synctest bubble")
	eventually.done("Eventually in tests: poll with internal/testwait")
}
