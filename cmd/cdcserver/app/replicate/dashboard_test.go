package replicate

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/internal/promrefs"
	"github.com/cdcflow/eventservice/internal/testwait"
)

// The Grafana dashboard of serve (deploy/grafana/cdcflow-postgres.json)
// and the alert rules (deploy/prometheus/cdcflow-alerts.yml) name only
// metrics serve exports: serve replicates two tables between two real
// servers (a snapshot, then the stream), its /metrics is scraped, and every
// metric family the dashboard's queries and the rules' expressions name
// must be in it. The scrape is polled with a deadline, for gauges that a
// poll of the slot sets first. The source has max_slot_wal_keep_size set,
// so that the slot's safe WAL size is exported (it is absent when
// unlimited).
func TestTheDashboardAndTheAlertsNameServedMetrics(t *testing.T) {
	dashboard, err := promrefs.DashboardMetrics("../../../../deploy/grafana/cdcflow-postgres.json")
	require.NoError(t, err)
	require.Greater(t, len(dashboard), 20)
	rules, err := promrefs.RuleMetrics("../../../../deploy/prometheus/cdcflow-alerts.yml")
	require.NoError(t, err)
	require.Greater(t, len(rules), 10)
	var want []string // up, Prometheus's own, is not one of them
	for _, name := range slices.Concat(dashboard, rules) {
		if !slices.Contains(want, name) {
			want = append(want, name)
		}
	}

	p := newPair(t)
	pgtest.Set(t, p.conn, "max_slot_wal_keep_size", "1GB")
	for i := 1; i <= 2; i++ {
		p.exec(fmt.Sprintf("CREATE TABLE m%d (id int PRIMARY KEY, v text)", i))
		p.exec(fmt.Sprintf("INSERT INTO m%d SELECT g, 'v' || g FROM generate_series(1, 50) g", i))
	}
	stop, stderr := p.serve(p.config())
	defer func() { _ = stop() }() // stop is idempotent: the end of the test calls it too
	p.waitEqual("the snapshot")
	p.exec("INSERT INTO m1 SELECT g, 'w' || g FROM generate_series(51, 80) g")
	p.exec("UPDATE m2 SET v = 'updated' WHERE id % 3 = 0")
	p.exec("DELETE FROM m2 WHERE id % 7 = 0")
	p.waitEqual("the stream")
	addr := metricsAddr(t, stderr)

	var missing []string
	testwait.Until(time.Minute, func() bool { // the assertion below names what is missing
		scraped := map[string]bool{}
		require.NoError(t, promrefs.Scrape(addr, scraped))
		missing = missing[:0]
		for _, name := range want {
			if !scraped[name] {
				missing = append(missing, name)
			}
		}
		return len(missing) == 0
	})
	require.NoError(t, stop(), stderr.String())
	require.Empty(t, missing, "named by deploy/grafana/cdcflow-postgres.json or deploy/prometheus/cdcflow-alerts.yml, and not exported by serve")
}
