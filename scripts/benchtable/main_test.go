package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseAndRatios(t *testing.T) {
	in := `goos: linux
BenchmarkNotifySaturated-2   	100	  60.0 ns/op	 800 p999-ns	 0 B/op	 0 allocs/op
BenchmarkNotifySaturated-2   	100	  70.0 ns/op	 800 p999-ns	 0 B/op	 0 allocs/op
BenchmarkNotifySaturated-2   	100	  90.0 ns/op	 800 p999-ns	 0 B/op	 0 allocs/op
BenchmarkNotifyIdle-2        	100	 140.0 ns/op	 900 p999-ns	 0 B/op	 0 allocs/op
BenchmarkStoreWrite-2        	10	 100 ns/op	 250.5 MB/s	 2000000 rows/s
BenchmarkIdleFootprint/dispatchers=10-2	1	 5 ns/op	 981.0 B/dispatcher	 7393 ns/register
`
	dir := t.TempDir()
	p := filepath.Join(dir, "bench.out")
	if err := os.WriteFile(p, []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run([]string{p}, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"BenchmarkNotifySaturated", "notify saturated / idle (ns/op)", "0.50", "2000000", "250",
		"981 B/dispatcher  7393 ns/register"} {
		if !strings.Contains(s, want) {
			t.Fatalf("output lacks %q:\n%s", want, s)
		}
	}
	js := filepath.Join(dir, "server.json")
	if err := os.WriteFile(js, []byte(`{"verified":true,"dispatchers":10000,"notify_ns":{"p50":200,"p99":900,"max":5000},"resolved_lag_ms":{"p50":30,"p99":400,"max":900}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run([]string{p, js}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "p99 900 ns") || !strings.Contains(out.String(), "p99 400.0 ms") {
		t.Fatalf("server figures missing:\n%s", out.String())
	}
	if err := run(nil, &out); err == nil {
		t.Fatal("missing argument accepted")
	}
}

func TestUpdateRewritesOnlyTheGeneratedBlocks(t *testing.T) {
	dir := t.TempDir()
	bench := filepath.Join(dir, "bench.out")
	in := "BenchmarkNotifySaturated-2 100 60.0 ns/op\nBenchmarkNotifyIdle-2 100 120.0 ns/op\n"
	readme := filepath.Join(dir, "README.md")
	doc := filepath.Join(dir, "benchmarks.md")
	for p, body := range map[string]string{
		bench:  in,
		readme: "intro\n<!-- benchtable:headline -->\nstale 9.99\n<!-- /benchtable:headline -->\noutro\n",
		doc:    "how to read\n<!-- benchtable:table -->\nstale\n<!-- /benchtable:table -->\nrows explained\n",
	} {
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := run([]string{"-update", "-readme", readme, "-doc", doc, bench}, &out); err != nil {
		t.Fatal(err)
	}
	r, _ := os.ReadFile(readme)
	d, _ := os.ReadFile(doc)
	for _, c := range []struct {
		got, want string
	}{{string(r), "intro\n"}, {string(r), "0.50"}, {string(r), "\noutro\n"}, {string(d), "BenchmarkNotifyIdle"},
		{string(d), "rows explained"}, {string(d), "medians of 1 runs"}} {
		if !strings.Contains(c.got, c.want) {
			t.Fatalf("lacks %q:\n%s", c.want, c.got)
		}
	}
	if strings.Contains(string(r), "stale") || strings.Contains(string(d), "stale") {
		t.Fatalf("old block content kept:\n%s\n%s", r, d)
	}
	if strings.Contains(string(r), "BenchmarkNotifyIdle ") {
		t.Fatal("the README restates the table")
	}
	if err := os.WriteFile(doc, []byte("no markers\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"-update", "-readme", readme, "-doc", doc, bench}, &out); err == nil {
		t.Fatal("a document without its block accepted")
	}
}

func TestScaleTable(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "1m.json")
	if err := os.WriteFile(js, []byte(`{"verified":true,"dispatchers":1000000,"rows_per_sec":20000,"resolved_lag_ms":{"p50":500,"p99":1006.5,"max":1700},
		"warmup_sec":1.5,"warm":true,"wall_sec":60,"peak_rss_mb":1024,"flags":"--tables 1000000 --progress-interval 0 --json --metrics-addr= --resolved-interval 1s"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	doc := filepath.Join(dir, "benchmarks.md")
	if err := os.WriteFile(doc, []byte("a\n<!-- benchtable:scale -->\nstale\n<!-- /benchtable:scale -->\nb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run([]string{"-scale", "-update", "-doc", doc, js}, &out); err != nil {
		t.Fatal(err)
	}
	d, _ := os.ReadFile(doc)
	for _, want := range []string{"--tables 1000000 --resolved-interval 1s", "1006.5", "1.5s", "1024", " 1074\n", "make scale", "\nb\n"} {
		if !strings.Contains(string(d), want) {
			t.Fatalf("scale block lacks %q:\n%s", want, d)
		}
	}
	if strings.Contains(string(d), "stale") {
		t.Fatalf("old block kept:\n%s", d)
	}
	cold := filepath.Join(dir, "cold.json")
	if err := os.WriteFile(cold, []byte(`{"verified":true,"dispatchers":1000000,"warm":false,"flags":"--tables 1000000"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run([]string{"-scale", cold}, &out); err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(out.String()); !slices.Equal(f[len(f)-7:len(f)-3], []string{"-", "-", "-", "never"}) {
		t.Fatalf("a run that never warmed up shows lag figures:\n%s", out.String())
	}
	if err := run([]string{"-scale"}, &out); err == nil {
		t.Fatal("-scale without runs accepted")
	}
}

func TestRemoteRatio(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	r1 := write("r1.json", `{"verified":true,"dispatchers":4000,"rows_per_sec":30000,"resolved_lag_ms":{"p99":900},"warm":true,"flags":"--remote-collectors 2 --changefeeds 2"}`)
	r2 := write("r2.json", `{"verified":true,"dispatchers":4000,"rows_per_sec":40000,"resolved_lag_ms":{"p99":700},"warm":true,"flags":"--remote-collectors 2 --changefeeds 2"}`)
	r3 := write("r3.json", `{"verified":true,"dispatchers":4000,"rows_per_sec":50000,"resolved_lag_ms":{"p99":800},"warm":true,"flags":"--remote-collectors 2 --changefeeds 2"}`)
	a1 := write("a1.json", `{"verified":true,"dispatchers":4000,"rows_per_sec":80000,"resolved_lag_ms":{"p99":40},"warm":true,"flags":"--changefeeds 2"}`)
	var out bytes.Buffer
	if err := run([]string{"-remote", r1, r2, r3, a1}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"other processes 40000 rows/s, lag p99 800.0 ms (3 runs)", "one process 80000 rows/s, lag p99 40.0 ms (1 runs)", "one process: 0.50 (target >= 0.5)"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	if err := run([]string{"-remote", r1}, &out); err == nil {
		t.Fatal("-remote without one-process runs accepted")
	}
}
