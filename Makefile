# Makefile for github.com/cdcflow/eventservice.
# `make test` is the project's test command; .ci/run runs exactly that.

GO        ?= go
PKGS      ?= ./...
BENCHTIME ?= 1s
COUNT     ?= 5
FUZZTIME  ?= 10s

.PHONY: all build test vet fmt-check tidy-check rules bench scale scale-runs scale-thp remote remote-rows fuzz soak run clean

all: build

build:
	$(GO) build $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

# tidy-check fails when `go mod tidy` would change go.mod or go.sum (a
# direct import marked indirect, a missing or stale sum).
tidy-check:
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }

vet:
	$(GO) vet $(PKGS)

# rules checks serve's Prometheus alert rules (deploy/prometheus) and runs
# their unit tests, with promtool (Debian's prometheus package; .ci/run
# installs it).
PROMTOOL ?= promtool
rules:
	@command -v $(PROMTOOL) >/dev/null 2>&1 || { echo "rules: $(PROMTOOL) not found: install it (apt-get install prometheus) or set PROMTOOL=/path/to/promtool" >&2; exit 1; }
	$(PROMTOOL) check rules deploy/prometheus/cdcflow-alerts.yml deploy/prometheus/cdcflow-cluster-alerts.yml
	$(PROMTOOL) test rules deploy/prometheus/cdcflow-alerts_test.yml deploy/prometheus/cdcflow-cluster-alerts_test.yml

test: fmt-check tidy-check vet rules
	$(GO) test -race -timeout 20m $(PKGS)

# bench runs every benchmark with -benchmem, COUNT times, then cdcserver
# synthetic in its saturation configuration (10k tables, one scan worker, a
# scan channel of one), prints one table of medians, the headline ratios
# and the server's notify p99 and lag (scripts/benchtable), and rewrites the
# generated blocks of README.md (headline) and docs/benchmarks.md (table)
# with them.
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count $(COUNT) -benchtime $(BENCHTIME) $(PKGS) | tee bench.out
	$(GO) run ./cmd/cdcserver synthetic --tables 10000 --scan-workers 1 --scan-queue 1 --duration 15s \
		--progress-interval 0 --metrics-addr "" --json > bench_server.json
	$(GO) run ./scripts/benchtable bench.out bench_server.json
	$(GO) run ./scripts/benchtable -update bench.out bench_server.json

# scale runs cdcserver synthetic at the sizes of the scale work (10k tables
# with the defaults; 100k and 1M tables with a 1 s resolved interval; 100k
# tables of two changefeeds with their collectors in two other processes,
# which the server starts as cdcserver synthetic --role collector) and writes
# one table of them into docs/benchmarks.md (scripts/benchtable -scale). A
# run that fails verification still lands in the table, marked; the 1M run
# goes four times: as it is, with --huge-pages, with the tables'
# resolved-ts advancing in groups of 1024 consecutive IDs (a TiKV region's
# granularity; --resolved-group-tables), and under a soft memory limit of
# 1900 MiB (--memory-limit: the 2 GiB peak RSS of issue 22 with room for
# what lies outside the Go runtime). About 10 minutes.
SCALE_FLAGS = --progress-interval 0 --metrics-addr= --json
# remote: the service with two collector processes against one process, the
# same workload, interleaved, three times each; benchtable writes the table
# and the rows/s ratio into docs/benchmarks.md.
REMOTE_FLAGS ?= --changefeeds 2 --tables 2000 --duration 10s --json --progress-interval 0 --metrics-addr ""
remote:
	$(GO) build -o bin/cdcserver ./cmd/cdcserver
	for i in 1 2 3; do \
		bin/cdcserver synthetic --remote-collectors 2 $(REMOTE_FLAGS) > remote-$$i.json || exit 1; \
		bin/cdcserver synthetic $(REMOTE_FLAGS) > remote-all-$$i.json || exit 1; \
	done
	$(GO) run ./scripts/benchtable -remote remote-*.json
	$(GO) run ./scripts/benchtable -remote -update remote-*.json

# remote-rows: the same comparison with 400k rows/s offered (issue 22's
# rows target), where the collector processes' durable sinks are the
# ceiling. A run that misses its drain still lands in the table, marked.
REMOTE_ROWS_FLAGS ?= --changefeeds 2 --tables 2000 --rate 400000 --duration 10s --json --progress-interval 0 --metrics-addr ""
remote-rows:
	$(GO) build -o bin/cdcserver ./cmd/cdcserver
	for i in 1 2 3; do \
		bin/cdcserver synthetic --remote-collectors 2 $(REMOTE_ROWS_FLAGS) > rows400k-remote-$$i.json; \
		bin/cdcserver synthetic $(REMOTE_ROWS_FLAGS) > rows400k-one-$$i.json; \
	done; true
	$(GO) run ./scripts/benchtable -remote rows400k-*.json
	$(GO) run ./scripts/benchtable -remote -block remote-rows -target remote-rows -update rows400k-*.json

SCALE_1M = --tables 1000000 --resolved-interval 1s --rate 20000 --ddl-interval 0 --duration 30s
SCALE_REMOTE = --remote-collectors 2 --changefeeds 2 --tables 100000 --resolved-interval 1s --rate 10000 --ddl-interval 0 --duration 20s
SCALE_RUNS = scale-1k.json scale-10k.json scale-100k.json scale-100k-remote.json scale-1m.json scale-1m-hp.json scale-1m-region.json scale-1m-limit.json
THP_MODE = /sys/kernel/mm/transparent_hugepage/enabled
scale-runs:
	$(GO) build -o bin/cdcserver ./cmd/cdcserver
	-bin/cdcserver synthetic --tables 1000 --duration 18s $(SCALE_FLAGS) > scale-1k.json
	-bin/cdcserver synthetic --tables 10000 --duration 20s $(SCALE_FLAGS) > scale-10k.json
	-bin/cdcserver synthetic --tables 100000 --rate 10000 --ddl-interval 0 --resolved-interval 1s --duration 10s $(SCALE_FLAGS) > scale-100k.json
	-bin/cdcserver synthetic $(SCALE_REMOTE) $(SCALE_FLAGS) > scale-100k-remote.json
	-bin/cdcserver synthetic $(SCALE_1M) $(SCALE_FLAGS) > scale-1m.json
	-bin/cdcserver synthetic $(SCALE_1M) --huge-pages $(SCALE_FLAGS) > scale-1m-hp.json
	-bin/cdcserver synthetic $(SCALE_1M) --resolved-group-tables 1024 $(SCALE_FLAGS) > scale-1m-region.json
	-bin/cdcserver synthetic $(SCALE_1M) --memory-limit 1900MiB $(SCALE_FLAGS) > scale-1m-limit.json

scale: scale-runs
	$(GO) run ./scripts/benchtable -scale -update $(SCALE_RUNS)
	$(GO) run ./scripts/benchtable -scale $(SCALE_RUNS)

# scale-thp is make scale plus the million-table run again with the host's
# transparent huge pages set to always (root only; the mode is put back
# afterwards), both in the table: the Go heap gets huge pages only then, and
# at a million dispatchers TLB misses are much of an advance's cost.
scale-thp: scale-runs
	prev=$$(sed 's/.*\[\(.*\)\].*/\1/' $(THP_MODE)); \
	echo always > $(THP_MODE) || exit 1; \
	bin/cdcserver synthetic $(SCALE_1M) $(SCALE_FLAGS) > scale-1m-thp.json; \
	echo $$prev > $(THP_MODE)
	$(GO) run ./scripts/benchtable -scale -update -target scale-thp $(SCALE_RUNS) scale-1m-thp.json
	$(GO) run ./scripts/benchtable -scale $(SCALE_RUNS) scale-1m-thp.json

# fuzz runs each fuzz target for FUZZTIME.
fuzz:
	@set -e; for pkg in $$($(GO) list $(PKGS)); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
			echo "== $$pkg $$f"; \
			$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done

clean:
	$(GO) clean -testcache
	rm -f bench.out bench_server.json scale-*.json remote-*.json rows400k-*.json bin/cdcserver

# run starts the synthetic server (cdcserver synthetic) with its defaults
# (1000 tables, about 20 seconds on 2 cores) and verifies delivery at the
# end; ARGS adds its flags.
run:
	$(GO) run ./cmd/cdcserver synthetic $(ARGS)

# soak runs the end-to-end suites at soak sizes (CDCFLOW_SOAK=1 scales every
# scenario up, see tests/doc.go) and the model test with SOAK_SEEDS seeds.
SOAK_SEEDS ?= 100
soak:
	CDCFLOW_SOAK=1 CDCFLOW_MODEL_SEEDS=$(SOAK_SEEDS) $(GO) test -race -count=1 -run . -timeout 60m -v ./tests/

# pgbench runs `cdcserver serve` side by side with PostgreSQL's native
# logical replication (PG15 -> PG15, fresh servers, fsync on): 1M rows in
# 4-row transactions over 100 and 1000 tables, the source's rows/s against
# a run without replication, lag, catch-up, a 300k-row backlog's drain and
# compare; scripts/pgbench prints the table and writes it into
# docs/benchmarks.md. About 10 minutes; PGBENCH_FLAGS adds flags (-runs 3: about 30).
PGBENCH_FLAGS ?=
.PHONY: chaos
# The cluster's fault schedule, long: 20 seeded random faults (at least 10
# kills of the owning node) against three nodes and three etcd members at
# the default 10 s lease TTL; prints the table of faults, times to
# replicate again (p50, p99) and verdicts. CHAOS_SEED replays a schedule.
CHAOS_SEED ?= 1
chaos:
	CDCFLOW_CHAOS_SEED=$(CHAOS_SEED) CDCFLOW_CHAOS_FAULTS=20 CDCFLOW_CHAOS_KILLS=10 CDCFLOW_CHAOS_TTL_S=10 \
		go test -count=1 -timeout 60m -run '^TestClusterChaos$$' -v ./tests 2>&1 | grep -v '^{"level"' | grep -E '^\s+(cluster_chaos_test|\||chaos|verdicts)|^(ok|FAIL|---)'

# nodemem runs BenchmarkNodeMemory (tests/): one cdcserver server process
# with 1 and then 8 changefeeds between two PostgreSQL 15 servers, idle and
# under load; its resident memory per changefeed (docs/benchmarks.md, "A
# node's memory per changefeed"). About 2 minutes a run; NODEMEM_FLAGS adds
# flags of the node (--memory-limit 768MiB).
NODEMEM_COUNT ?= 3
NODEMEM_FLAGS ?=
.PHONY: nodemem
nodemem:
	CDCFLOW_NODEMEM_FLAGS="$(NODEMEM_FLAGS)" $(GO) test -run '^$$' -bench '^BenchmarkNodeMemory$$' -benchtime 1x -count $(NODEMEM_COUNT) -timeout 60m ./tests

.PHONY: pgbench
pgbench:
	$(GO) run ./scripts/pgbench -update $(PGBENCH_FLAGS)

# pgshutdown times a shutdown of the source (smart and fast while idle, fast
# under load with a transaction left open) with `cdcserver serve` connected
# and with a native subscription, and writes the table into
# docs/benchmarks.md (about a minute; PGSHUTDOWN_FLAGS='-runs 3' for medians).
PGSHUTDOWN_FLAGS ?=
.PHONY: pgshutdown
pgshutdown:
	$(GO) run ./scripts/pgshutdown -update $(PGSHUTDOWN_FLAGS)
