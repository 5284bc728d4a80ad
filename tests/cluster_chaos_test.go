package tests

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/node"
	"github.com/cdcflow/eventservice/cmd/cdcserver/app/replicate"
	"github.com/cdcflow/eventservice/internal/testwait"
)

// The chaos schedule's knobs (make chaos sets them; make test runs the
// defaults, a short schedule).
const (
	envChaosSeed   = "CDCFLOW_CHAOS_SEED"   // the schedule's seed (default 1)
	envChaosFaults = "CDCFLOW_CHAOS_FAULTS" // how many faults (default 4)
	envChaosTTL    = "CDCFLOW_CHAOS_TTL_S"  // the nodes' lease TTL in seconds (default 3)
	envChaosKills  = "CDCFLOW_CHAOS_KILLS"  // at least this many kills of the owner among them (default 1)
)

// chaosFault is one kind of fault: it runs against the cluster and
// returns how long the changefeed took to replicate again (its first
// commit by a new writer; 0 for a fault after which nothing should move).
type chaosFault struct {
	name string
	run  func(h *clusterHarness) time.Duration
}

// TestClusterChaos runs a seeded random schedule of faults (each kind at
// least once when there is room) against a three-node cluster under a steady load, with a second changefeed
// created, paused, resumed and removed between the faults (each time on
// whatever nodes are up), then audits every target write,
// and prints a table: each fault, how often it ran, the time to replicate
// again (p50, p99), and the verdicts (rows lost, written twice, commits
// of an older writer after a newer one's first). The same seed gives the
// same schedule. make chaos runs it long (CDCFLOW_CHAOS_*).
func TestClusterChaos(t *testing.T) {
	seed := envUint(t, envChaosSeed, 1)
	faults := int(envUint(t, envChaosFaults, 4))
	kills := int(envUint(t, envChaosKills, 1))
	ttl := time.Duration(envUint(t, envChaosTTL, 3)) * time.Second
	t.Logf("chaos seed %d, %d faults (%d kills of the owner at least), TTL %v (replay with %s=%d)", seed, faults, kills, ttl, envChaosSeed, seed)
	rng := rand.New(rand.NewPCG(seed, 59))
	h := newClusterHarness(t, ttl)
	h.routed = true // each node reaches the databases through its own proxies
	mark := h.startChangefeed(0)
	stop := h.load(0)
	writing := func() string { return h.writing("the owner writing") }
	takeOver := func(h *clusterHarness, act func(owner string)) time.Duration {
		w := writing()
		owner, from := h.owner("cf"), h.auditMark()
		act(owner)
		at := time.Now()
		_, seen := h.writerAfter(from, w, 2*time.Minute)
		return seen.Sub(at)
	}
	kinds := []chaosFault{
		{"kill -9 of the owner", func(h *clusterHarness) time.Duration {
			var owner string
			d := takeOver(h, func(o string) { owner = o; h.kill(o) })
			h.startNode(owner)
			return d
		}},
		{"SIGSTOP of the owner for 2 TTLs", func(h *clusterHarness) time.Duration {
			var owner string
			frozen := time.Now()
			d := takeOver(h, func(o string) { owner = o; h.signal(o, syscall.SIGSTOP) })
			testwait.Within(t, 2*ttl+time.Minute, "two TTLs frozen", func() bool { return time.Since(frozen) >= 2*ttl })
			h.signal(owner, syscall.SIGCONT)
			require.Error(t, h.nodes[owner].child.wait(), "a thawed node with its membership lost exits 1")
			h.startNode(owner)
			return d
		}},
		{"SIGTERM of the owner (a rolling restart's step)", func(h *clusterHarness) time.Duration {
			var owner string
			d := takeOver(h, func(o string) {
				owner = o
				h.signal(o, syscall.SIGTERM)
				require.NoError(t, h.nodes[o].child.wait(), "a clean stop")
			})
			h.startNode(owner)
			return d
		}},
		{"kill -9 of the coordinator, not the owner", func(h *clusterHarness) time.Duration {
			coord := h.coordinator()
			if coord == h.owner("cf") {
				require.Equal(t, http.StatusOK, h.api("POST", "/api/v1/nodes/"+coord+"/drain", nil, nil))
				testwait.Within(t, time.Minute, "the changefeed off the coordinator", func() bool { o := h.owner("cf"); return o != "" && o != coord })
			}
			h.kill(coord)
			at := time.Now()
			testwait.Within(t, time.Minute, "another coordinator", func() bool { c := h.coordinator(); return c != "" && c != coord })
			d := time.Since(at)
			h.startNode(coord)
			return d
		}},
		{"the owner partitioned from the source for 2 TTLs (caught up after)", func(h *clusterHarness) time.Duration {
			owner := h.owner("cf")
			px := h.nodes[owner].src
			return h.cutOwnerOff(owner, "partitioned from the source", px.Partition, px.Heal)
		}},
		{"the owner partitioned from the target for 2 TTLs (caught up after)", func(h *clusterHarness) time.Duration {
			owner := h.owner("cf")
			px := h.nodes[owner].dst
			return h.cutOwnerOff(owner, "partitioned from the target", px.Partition, px.Heal)
		}},
		{"SIGSTOP of the owner inside a target transaction", func(h *clusterHarness) time.Duration {
			h.columns++
			return h.freezeInsideATargetTransaction(fmt.Sprintf("c%d", h.columns))
		}},
		{"the owner cut off from etcd", func(h *clusterHarness) time.Duration {
			var owner string
			d := takeOver(h, func(o string) {
				owner = o
				for _, px := range h.nodes[o].etcd {
					px.Partition()
				}
			})
			require.Error(t, h.nodes[owner].child.wait(), "a node cut off from etcd exits 1")
			for _, px := range h.nodes[owner].etcd {
				px.Heal()
			}
			h.startNode(owner)
			return d
		}},
		{"one of three etcd members lost for 2 TTLs", func(h *clusterHarness) time.Duration {
			w := writing()
			owner, from := h.owner("cf"), h.auditMark()
			m := rng.IntN(3)
			h.killMember(m)
			lost := time.Now()
			testwait.Within(t, 2*ttl+time.Minute, "two TTLs without the member", func() bool { return time.Since(lost) >= 2*ttl })
			require.Equal(t, owner, h.owner("cf"), "moved without a member")
			var others int
			require.NoError(t, h.dstConn.QueryRow(t.Context(), "SELECT count(*) FROM audit.log WHERE seq > $1 AND writer <> $2", from, w).Scan(&others))
			require.Zero(t, others, "another writer while a member was lost")
			h.startMember(m)
			return 0
		}},
	}
	var schedule []int
	for range kills {
		schedule = append(schedule, 0)
	}
	if faults >= kills+len(kinds)-1 { // room for every kind: each at least once
		for k := 1; k < len(kinds); k++ {
			schedule = append(schedule, k)
		}
	}
	for len(schedule) < faults {
		schedule = append(schedule, rng.IntN(len(kinds)))
	}
	rng.Shuffle(len(schedule), func(i, j int) { schedule[i], schedule[j] = schedule[j], schedule[i] })
	// A second changefeed, of table t2 into another database, managed
	// between the faults: created, paused, resumed, removed, in turn.
	second := newManagedChangefeed(h)
	times := map[string][]time.Duration{}
	for i, k := range schedule {
		second.step(i)
		d := kinds[k].run(h)
		times[kinds[k].name] = append(times[kinds[k].name], d)
		t.Logf("fault %d/%d: %s: %v", i+1, len(schedule), kinds[k].name, d.Round(10*time.Millisecond))
	}
	v := h.quiesced(stop, mark, 0)
	second.finish()
	var b strings.Builder
	fmt.Fprintf(&b, "\nchaos seed %d, TTL %v, writers %s\n\n", seed, ttl, strings.Join(v.Writers, " "))
	fmt.Fprintf(&b, "| fault | runs | replicating again (a new coordinator; caught up after a database cut): p50 | p99 |\n|---|---|---|---|\n")
	for _, k := range kinds {
		ds := times[k.name]
		if len(ds) == 0 {
			continue
		}
		slices.Sort(ds)
		p := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
		fmt.Fprintf(&b, "| %s | %d | %v | %v |\n", k.name, len(ds), p(0.5).Round(10*time.Millisecond), p(0.99).Round(10*time.Millisecond))
	}
	fmt.Fprintf(&b, "\nverdicts: rows lost %d, rows written twice %d, commits of an older writer after a newer one's first %d\n", v.Lost, v.Twice, v.Overlaps)
	t.Log(b.String())
}

// managedChangefeed is a second changefeed, "cf2", of table t2 into
// database dst2 of the target's server, which a test manages while faults
// run.
type managedChangefeed struct {
	h      *clusterHarness
	dsn    string
	exists bool
	rows   int
}

func newManagedChangefeed(h *clusterHarness) *managedChangefeed {
	h.t.Helper()
	_, err := h.srcConn.Exec(h.t.Context(), "CREATE TABLE t2 (id int PRIMARY KEY, v text)")
	require.NoError(h.t, err)
	_, err = h.dstConn.Exec(h.t.Context(), "CREATE DATABASE dst2")
	require.NoError(h.t, err)
	return &managedChangefeed{h: h, dsn: h.dst.DSNFor("dst2")}
}

// step writes a row of t2 and then makes the management call of step i:
// create, pause, resume, remove, in turn (a resume or a pause of a
// changefeed that is not there is a create).
func (m *managedChangefeed) step(i int) {
	h := m.h
	h.t.Helper()
	m.rows++
	_, err := h.srcConn.Exec(h.t.Context(), "INSERT INTO t2 VALUES ($1, 'v')", m.rows)
	require.NoError(h.t, err)
	op := []string{"create", "pause", "resume", "remove"}[i%4]
	if !m.exists {
		op = "create"
	}
	switch op {
	case "create":
		require.Equal(h.t, http.StatusCreated, h.api("POST", "/api/v1/changefeeds", map[string]any{"name": "cf2",
			"config": node.ChangefeedConfig{Source: h.src.DSN, Sink: m.dsn, Include: []string{"public.t2"}}}, nil))
		m.exists = true
	case "pause", "resume":
		require.Equal(h.t, http.StatusOK, h.api("POST", "/api/v1/changefeeds/cf2/"+op, nil, nil))
	case "remove":
		m.remove()
	}
	h.t.Logf("second changefeed: %s", op)
}

// remove removes it and checks that its slot is gone.
func (m *managedChangefeed) remove() {
	h := m.h
	h.t.Helper()
	require.Equal(h.t, http.StatusOK, h.api("DELETE", "/api/v1/changefeeds/cf2", nil, nil))
	var slots int
	require.NoError(h.t, h.srcConn.QueryRow(h.t.Context(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cf2'").Scan(&slots))
	require.Zero(h.t, slots, "the removed changefeed's slot")
	m.exists = false
	_, err := h.dstConn.Exec(h.t.Context(), "DROP DATABASE dst2 WITH (FORCE)") // a new one is copied afresh
	require.NoError(h.t, err)
	_, err = h.dstConn.Exec(h.t.Context(), "CREATE DATABASE dst2")
	require.NoError(h.t, err)
}

// finish resumes it if it is there, requires its target equal, and
// removes it.
func (m *managedChangefeed) finish() {
	h := m.h
	h.t.Helper()
	if !m.exists {
		return
	}
	require.Equal(h.t, http.StatusOK, h.api("POST", "/api/v1/changefeeds/cf2/resume", nil, nil))
	var out strings.Builder
	var err error
	require.True(h.t, testwait.Until(3*time.Minute, func() bool {
		out.Reset()
		err = replicate.Compare(h.t.Context(), h.src.DSN, m.dsn, "cf2", &out)
		return err == nil
	}), "the second changefeed never equal: %v\n%s", err, out.String())
	m.remove()
}
