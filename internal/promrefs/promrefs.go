package promrefs

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// ErrBadFile is a dashboard or a rule file with a query that names nothing.
var ErrBadFile = errors.New("promrefs: a query that names nothing")

// metricName matches the metric names in a query.
var metricName = regexp.MustCompile(`\b(?:cdcflow|process|go)_[a-z0-9_]+`)

// DashboardMetrics lists the metric families a Grafana dashboard's queries
// name: its panels' and its query variables'.
func DashboardMetrics(path string) ([]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
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
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var exprs []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			return nil, fmt.Errorf("%w: %s: panel %q has no query", ErrBadFile, path, p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Expr == "" {
				return nil, fmt.Errorf("%w: %s: panel %q has an empty query", ErrBadFile, path, p.Title)
			}
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(string); ok && v.Type == "query" {
			exprs = append(exprs, q)
		}
	}
	return namesIn(exprs), nil
}

// RuleMetrics lists the metric families the expressions of a Prometheus
// rule file name. Each `expr:` is read as YAML writes it in deploy/: the
// rest of its line, or the block (`|`, `>`) indented under it.
func RuleMetrics(path string) ([]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
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
		if strings.TrimSpace(strings.Join(block, "")) == "" {
			return nil, fmt.Errorf("%w: %s:%d: an empty expr", ErrBadFile, path, i+1)
		}
		exprs = append(exprs, strings.Join(block, "\n"))
	}
	return namesIn(exprs), nil
}

func indentOf(line string) int { return len(line) - len(strings.TrimLeft(line, " ")) }

// namesIn lists the metric families the PromQL expressions name, once
// each (comments ignored).
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

// Scrape adds the metric family names served at addr/metrics to names.
func Scrape(addr string, names map[string]bool) error {
	tr := &http.Transport{DisableKeepAlives: true} // no idle connection outlives a test (goleak)
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
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[familyOf(line[:i])] = true
		}
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
