package refdoc

import (
	"flag"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type size int64

func (s *size) String() string   { return "10737418240" }
func (s *size) Set(string) error { return nil }

// A flag table lists every flag in name order with the name of its value,
// its default (a size in its unit, an empty string as nothing) and its
// usage, made safe for a table cell.
func TestFlagTable(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.String("sink", "", "the target | a DSN")
	fs.Duration("timeout", 30*time.Second, "how long a `wait` may take")
	fs.Bool("json", false, "print JSON")
	var s size
	fs.Var(&s, "max", "a `size` at most")
	require.Equal(t, "| flag | default | meaning |\n|---|---|---|\n"+
		"| `--json` | `false` | print JSON |\n"+
		"| `--max size` | `10GiB` | a size at most |\n"+
		"| `--sink string` |  | the target \\| a DSN |\n"+
		"| `--timeout wait` | `30s` | how long a wait may take |\n", FlagTable(fs))
}

// The metric table is made from what a registry gathers: name order,
// lowercase types, sorted label names, the help; Unexported names what a
// registered collector describes and the gathering lacks (a vector
// without a series).
func TestMetricsAndUnexported(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		prometheus.NewCounterVec(prometheus.CounterOpts{Name: "b_total", Help: "B."}, []string{"reason", "target"}),
		prometheus.NewGauge(prometheus.GaugeOpts{Name: "a", Help: "A, or <none>.", ConstLabels: prometheus.Labels{"kind": "x"}}),
		prometheus.NewHistogram(prometheus.HistogramOpts{Name: "c_seconds", Help: "C."}),
	)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	ms := Metrics(mfs, func(name string) bool { return name != "c_seconds" })
	require.Equal(t, "| metric | type | labels | meaning |\n|---|---|---|---|\n"+
		"| `a` | gauge | `kind` | A, or &lt;none>. |\n", MetricTable(ms))
	require.Equal(t, []string{"b_total"}, Unexported(reg, mfs))
	require.Equal(t, "histogram", Metrics(mfs, func(string) bool { return true })[1].Type)
}

// Scrape reads what promhttp serves, with types and help.
func TestScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "X."}, []string{"k"}))
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "y", Help: "Y."}))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	mfs, err := Scrape(strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	require.Equal(t, []Metric{{Name: "y", Type: "gauge", Help: "Y."}}, Metrics(mfs, func(string) bool { return true }))
}

// Sync passes a block that holds the rendering, names the first differing
// line and the command otherwise, and with update rewrites only the block.
func TestSync(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ref.md")
	doc := "intro\n<!-- reference:x -->\nold\n<!-- /reference:x -->\noutro\n"
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o644))
	err := Sync(path, "x", "new\n", false)
	require.ErrorContains(t, err, "the document has: old")
	require.ErrorContains(t, err, "the code makes:   new")
	require.ErrorContains(t, err, UpdateCommand)
	got, _ := os.ReadFile(path)
	require.Equal(t, doc, string(got), "no write without update")
	require.NoError(t, Sync(path, "x", "new\n", true))
	got, _ = os.ReadFile(path)
	require.Equal(t, "intro\n<!-- reference:x -->\nnew\n<!-- /reference:x -->\noutro\n", string(got))
	require.NoError(t, Sync(path, "x", "new\n", false))
	require.ErrorContains(t, Sync(path, "y", "new\n", false), "no <!-- reference:y -->")
}
