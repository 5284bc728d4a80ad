package replicate

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/pgtest"
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
	dashboard := dashboardMetrics(t, "../../../../deploy/grafana/cdcflow-postgres.json")
	require.Greater(t, len(dashboard), 20)
	rules := ruleMetrics(t, "../../../../deploy/prometheus/cdcflow-alerts.yml")
	require.Greater(t, len(rules), 10)
	var want []string // up, Prometheus's own, is not one of them (metricName)
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
		require.NoError(t, scrapeNames(addr, scraped))
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

// metricName matches the names of serve's metrics in a query: cdcflow's,
// the process's and the Go runtime's (not up, which Prometheus records).
var metricName = regexp.MustCompile(`\b(?:cdcflow|process|go)_[a-z0-9_]+`)

// dashboardMetrics lists the metric families the dashboard's queries name:
// its panels' and its variables' (cmd/cdcserver/app/synthetic's, which checks
// the event service's dashboard, with the variables).
func dashboardMetrics(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(raw, &d))
	var exprs []string
	for _, p := range d.Panels {
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, "panel %q has an empty query", p.Title)
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(string); ok && v.Type == "query" {
			exprs = append(exprs, q)
		}
	}
	return namesIn(exprs)
}

// ruleMetrics lists the metric families the expressions of a Prometheus
// rule file name. Each `expr:` is read as YAML writes it here: the rest of
// its line, or the block (`|`, `>`) indented under it.
func ruleMetrics(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	key := regexp.MustCompile(`^(\s*)(?:- )?expr:\s*(.*)$`)
	lines := strings.Split(string(raw), "\n")
	var exprs []string
	for i := 0; i < len(lines); i++ {
		m := key.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		if rest := strings.TrimSpace(m[2]); rest != "" && !strings.ContainsAny(rest[:1], "|>") {
			exprs = append(exprs, rest)
			continue
		}
		var block []string
		for i+1 < len(lines) && (strings.TrimSpace(lines[i+1]) == "" || indentOf(lines[i+1]) > len(m[1])) {
			i++
			block = append(block, lines[i])
		}
		require.NotEmpty(t, strings.TrimSpace(strings.Join(block, "")), "%s:%d: an empty expr", path, i+1)
		exprs = append(exprs, strings.Join(block, "\n"))
	}
	return namesIn(exprs)
}

func indentOf(line string) int { return len(line) - len(strings.TrimLeft(line, " ")) }

// namesIn lists the metric families the PromQL expressions name, once
// each (a histogram's series under its family; comments ignored).
func namesIn(exprs []string) []string {
	var out []string
	for _, e := range exprs {
		for _, line := range strings.Split(e, "\n") {
			line, _, _ = strings.Cut(line, "#")
			for _, name := range metricName.FindAllString(line, -1) {
				if name = familyOf(name); !slices.Contains(out, name) {
					out = append(out, name)
				}
			}
		}
	}
	return out
}

// scrapeNames adds the metric family names served at addr/metrics to names
// (histogram and summary series under their family's name).
func scrapeNames(addr string, names map[string]bool) error {
	tr := &http.Transport{DisableKeepAlives: true} // no idle connection outlives the test (goleak)
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name := line[:strings.IndexAny(line, "{ ")]
		names[familyOf(name)] = true
	}
	return nil
}

// familyOf strips a histogram's series suffix.
func familyOf(name string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			return base
		}
	}
	return name
}
