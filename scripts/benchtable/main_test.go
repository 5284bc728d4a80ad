package main

import (
	"bytes"
	"os"
	"path/filepath"
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
	for _, want := range []string{"BenchmarkNotifySaturated", "notify saturated / idle (ns/op)", "0.50", "2000000", "250"} {
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
