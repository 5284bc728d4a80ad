package replicate

import (
	"flag"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/internal/refdoc"
	"github.com/cdcflow/eventservice/internal/testwait"
)

var update = flag.Bool("update", false, "rewrite the generated blocks of docs/reference/ from the code")

// docs/reference/metrics.md lists every metric family a running serve
// exports, as the scrape of its /metrics describes them (type, help,
// labels): serve replicates a table between two real servers (a snapshot,
// then the stream), and its /metrics is scraped until the slot's
// statistics, which a poll of the slot sets first, are in it. The source
// has max_slot_wal_keep_size set, so that the slot's safe WAL size is
// exported (it is absent when unlimited). The Go runtime's and the
// process's standard families (go_*, process_*) are left out: the
// document names them in prose.
func TestReferenceDocs(t *testing.T) {
	p := newPair(t)
	pgtest.Set(t, p.conn, "max_slot_wal_keep_size", "1GB")
	p.exec("CREATE TABLE r1 (id int PRIMARY KEY, v text)")
	p.exec("INSERT INTO r1 SELECT g, 'v' || g FROM generate_series(1, 20) g")
	stop, stderr := p.serve(p.config())
	defer func() { _ = stop() }() // stop is idempotent: the end of the test calls it too
	p.waitEqual("the snapshot")
	p.exec("INSERT INTO r1 SELECT g, 'w' || g FROM generate_series(21, 30) g")
	p.waitEqual("the stream")
	addr := metricsAddr(t, stderr)

	late := []string{"cdcflow_pgsource_slot_retained_bytes", "cdcflow_pgsource_slot_safe_wal_size_bytes", "cdcflow_pgsource_slot_wal_status"}
	var mfs []*dto.MetricFamily
	testwait.Until(time.Minute, func() bool {
		var err error
		mfs, err = refdoc.Scrape(addr)
		require.NoError(t, err)
		return len(missingFamilies(mfs, late)) == 0
	})
	require.Empty(t, missingFamilies(mfs, late), "families serve never exported")
	require.NoError(t, stop(), stderr.String())

	ms := refdoc.Metrics(mfs, func(name string) bool { return strings.HasPrefix(name, "cdcflow_") })
	require.Greater(t, len(ms), 50, "serve's families")
	require.NoError(t, refdoc.Sync("../../../../docs/reference/metrics.md", "serve-metrics", refdoc.MetricTable(ms), *update))
}

// missingFamilies lists the names of want that mfs lacks.
func missingFamilies(mfs []*dto.MetricFamily, want []string) []string {
	have := map[string]bool{}
	for _, mf := range mfs {
		have[mf.GetName()] = true
	}
	var out []string
	for _, name := range want {
		if !have[name] {
			out = append(out, name)
		}
	}
	return out
}
