package tests

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
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
	leaves := []string{"internal/backoff", "internal/dueheap", "internal/latency", "internal/optcheck", "internal/pgdial", "internal/pglink", "internal/promutil", "internal/slots", "internal/touchahead"}
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
