package refdoc

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/encoding/protodelim"

	"github.com/cdcflow/eventservice/internal/docblock"
)

// UpdateCommand rewrites every generated reference from the code: the
// packages whose TestReferenceDocs render one.
const UpdateCommand = "go test ./cmd/cdcserver ./cmd/cdcserver/app/replicate ./cmd/cdcserver/app/synthetic -run TestReferenceDocs -update"

// FlagTable renders fs's flags as a Markdown table: the flag with the name
// of its value (as -help shows it), its default and its meaning, in name
// order.
func FlagTable(fs *flag.FlagSet) string {
	var b strings.Builder
	b.WriteString("| flag | default | meaning |\n|---|---|---|\n")
	fs.VisitAll(func(f *flag.Flag) {
		kind, usage := flag.UnquoteUsage(f)
		name := "`--" + f.Name
		if kind != "" {
			name += " " + kind
		}
		name += "`"
		def := Default(f)
		if def != "" {
			def = "`" + def + "`"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", name, def, cell(usage))
	})
	return b.String()
}

// Default is a flag's default as a reader types it: a size in the
// largest binary unit it is a whole number of, an empty string as nothing.
func Default(f *flag.Flag) string {
	kind, _ := flag.UnquoteUsage(f)
	def := f.DefValue
	if kind == "size" {
		if n, err := strconv.ParseInt(def, 10, 64); err == nil && n > 0 {
			units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
			u := 0
			for u < len(units)-1 && n%1024 == 0 {
				n /= 1024
				u++
			}
			return fmt.Sprintf("%d%s", n, units[u])
		}
	}
	return def
}

// cell makes text safe in a Markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	s = strings.ReplaceAll(s, "<", "&lt;")
	return strings.ReplaceAll(s, "\n", " ")
}

// Metric is a metric family as a reference lists it.
type Metric struct {
	Name, Type, Help string
	// Labels are the names of its variable and constant labels, sorted
	// (a histogram's le is not one).
	Labels []string
}

// Metrics lists the families of mfs that keep accepts, in name order.
func Metrics(mfs []*dto.MetricFamily, keep func(name string) bool) []Metric {
	var out []Metric
	for _, mf := range mfs {
		if !keep(mf.GetName()) {
			continue
		}
		m := Metric{Name: mf.GetName(), Type: strings.ToLower(mf.GetType().String()), Help: mf.GetHelp()}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if !slices.Contains(m.Labels, l.GetName()) {
					m.Labels = append(m.Labels, l.GetName())
				}
			}
		}
		slices.Sort(m.Labels)
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Metric) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// MetricTable renders ms as a Markdown table: name, type, labels, help.
func MetricTable(ms []Metric) string {
	var b strings.Builder
	b.WriteString("| metric | type | labels | meaning |\n|---|---|---|---|\n")
	for _, m := range ms {
		labels := ""
		if len(m.Labels) > 0 {
			labels = "`" + strings.Join(m.Labels, "`, `") + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", m.Name, m.Type, labels, cell(m.Help))
	}
	return b.String()
}

// descName finds a Desc's name in its String (the Desc has no accessor).
var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

// Unexported lists the metric families c describes that mfs lacks: a
// vector without a series, or a collector that exports nothing yet. A
// reference made from mfs would leave them out, and their type is not
// known until they have a series.
func Unexported(c prometheus.Collector, mfs []*dto.MetricFamily) []string {
	have := map[string]bool{}
	for _, mf := range mfs {
		have[mf.GetName()] = true
	}
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	var out []string
	for d := range ch {
		m := descName.FindStringSubmatch(d.String())
		if m != nil && !have[m[1]] && !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	slices.Sort(out)
	return out
}

// Scrape reads the metric families served at http://addr/metrics, in
// Prometheus's delimited protobuf format (types, help and labels as the
// process registered them).
func Scrape(addr string) ([]*dto.MetricFamily, error) {
	tr := &http.Transport{DisableKeepAlives: true} // no idle connection outlives a test
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited")
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.Contains(ct, "encoding=delimited") {
		return nil, fmt.Errorf("GET /metrics: served %q, not delimited protobuf", ct)
	}
	r := bufio.NewReader(resp.Body)
	var out []*dto.MetricFamily
	for {
		if _, err := r.Peek(1); err != nil {
			break // the end of the body
		}
		mf := &dto.MetricFamily{}
		if err := protodelim.UnmarshalFrom(r, mf); err != nil {
			return nil, fmt.Errorf("GET /metrics: %w", err)
		}
		out = append(out, mf)
	}
	return out, nil
}

// Sync checks that the block name of the document at path holds body.
// With update it rewrites the block when it differs instead; without it a
// difference is an error that names the first line that differs and
// UpdateCommand.
func Sync(path, name, body string, update bool) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	begin, end := []byte("<!-- reference:"+name+" -->\n"), []byte("<!-- /reference:"+name+" -->")
	i, j := bytes.Index(b, begin), bytes.Index(b, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s: no <!-- reference:%s --> ... <!-- /reference:%s --> block", path, name, name)
	}
	have := string(b[i+len(begin) : j])
	if have == body {
		return nil
	}
	if update {
		return docblock.Replace(path, "reference:"+name, body)
	}
	hl, wl := strings.Split(have, "\n"), strings.Split(body, "\n")
	n := 0
	for n < len(hl) && n < len(wl) && hl[n] == wl[n] {
		n++
	}
	line := func(ls []string) string {
		if n < len(ls) {
			return ls[n]
		}
		return "(end of block)"
	}
	return fmt.Errorf("%s: block reference:%s is out of date with the code; at its line %d\n  the document has: %s\n  the code makes:   %s\nrewrite it with:\n  %s",
		path, name, n+1, line(hl), line(wl), UpdateCommand)
}
