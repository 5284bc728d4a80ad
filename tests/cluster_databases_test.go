package tests

import (
	"context"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/faultproxy"
	"github.com/cdcflow/eventservice/internal/testwait"
)

// The owner cut off from the source, then from the target, under a steady
// load, each for two TTLs, each node reaching the databases through its
// own proxies (the specification names libpq services, which each node's
// service file resolves): its membership stays valid, so nothing moves
// (the assignment names it throughout); its changefeed fails and runs
// again after a back-off, and catches up once the link is back. Two ways
// to each database: a partition (connections reset, new ones refused) and
// a silent link (its requests held on the way, or the replies).
//
// Last, the owner cut off from the target with its link silent (what it
// holds open there stays open), and drained, as an operator does with a
// node that cannot reach a database: the changefeed moves to a node that
// can, which fences off what the cut-off node left open.
//
// After quiescing: equal, nothing lost or written twice, no commit of an
// older writer after a newer one's first; and throughout, the slot's
// confirmed position never ahead of the rows the target holds (sampled).
func TestClusterOwnerCutOffFromTheDatabases(t *testing.T) {
	const ttl = 3 * time.Second
	h := newClusterHarness(t, ttl)
	h.routed = true
	mark := h.startChangefeed(0)
	stop := h.load(0)
	stopSlotCheck := h.checkSlot("cf")
	owner := h.owner("cf")
	require.NotEmpty(t, owner)
	p := h.nodes[owner]
	for _, cut := range []struct {
		name     string
		do, heal func()
	}{
		{"partitioned from the source", p.src.Partition, p.src.Heal},
		{"silent to the source, both ways", func() { p.src.Hold(faultproxy.Upstream); p.src.Hold(faultproxy.Downstream) }, p.src.Release},
		{"partitioned from the target", p.dst.Partition, p.dst.Heal},
		{"without the target's replies", func() { p.dst.Hold(faultproxy.Downstream) }, p.dst.Release},
		{"silent to the target, both ways", func() { p.dst.Hold(faultproxy.Upstream); p.dst.Hold(faultproxy.Downstream) }, p.dst.Release},
	} {
		caughtUp := h.cutOwnerOff(owner, cut.name, cut.do, cut.heal)
		t.Logf("%s %s for %v: caught up %v after the link was back", owner, cut.name, 2*ttl, caughtUp.Round(10*time.Millisecond))
	}

	w := h.writing("the owner writing before it is cut off from the target and drained")
	from := h.auditMark()
	p.dst.Hold(faultproxy.Upstream)
	p.dst.Hold(faultproxy.Downstream)
	require.Equal(t, http.StatusOK, h.api("POST", "/api/v1/nodes/"+owner+"/drain", nil, nil))
	drained := time.Now()
	newWriter, at := h.writerAfter(from, w, 2*time.Minute)
	t.Logf("%s silent to the target and drained: replicating again as %s on %s after %v", owner, newWriter, h.owner("cf"),
		at.Sub(drained).Round(10*time.Millisecond))
	require.NotEqual(t, owner, h.owner("cf"))
	p.dst.Release()

	h.quiesced(stop, mark, 0)
	samples, checked, missing := stopSlotCheck()
	t.Logf("slot checker: %d samples of the confirmed position, %d rows checked behind them, %d missing", samples, checked, missing)
	require.Positive(t, checked, "rows behind a confirmed position")
	require.Zero(t, missing, "rows at or before the slot's confirmed position missing from the target")
}

// The owner frozen (SIGSTOP) inside a target transaction that holds the
// fence: an event trigger on the target sleeps two seconds at the end of the
// ALTER TABLE the sink applies (in an explicit transaction, after the
// fence), and the node is frozen while it sleeps, so that its backend is
// left idle in the transaction, holding the fence (and the table's lock).
// Another node takes over once the lease expired, waits for the fence
// FenceWait (the TTL), ends that backend and replicates: well before the
// target's own idle_in_transaction_session_timeout (30 s) would end it.
// Thawed, the frozen node finds its membership lost and exits (1); nothing
// of its transaction commits (the audit's overlaps).
func TestClusterOwnerFrozenInsideATargetTransaction(t *testing.T) {
	const ttl = 3 * time.Second
	h := newClusterHarness(t, ttl)
	mark := h.startChangefeed(0)
	stop := h.load(0)
	h.freezeInsideATargetTransaction("note")
	h.quiesced(stop, mark, 0)
	var note bool
	require.NoError(t, h.dstConn.QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_name = 't' AND column_name = 'note')").
		Scan(&note))
	require.True(t, note, "the ALTER applied, by the new owner")
}

// freezeInsideATargetTransaction freezes the owner inside a target
// transaction that holds the fence (TestClusterOwnerFrozenInsideATargetTransaction
// says how: the source adds column to t), requires the take-over within
// the bound and the frozen backend ended, thaws the node, requires it to
// exit (1) and starts it again; it returns the time from the freeze to the
// new writer's first commit.
func (h *clusterHarness) freezeInsideATargetTransaction(column string) time.Duration {
	h.t.Helper()
	ctx := h.t.Context()
	if !h.slowDDL {
		for _, q := range []string{
			`CREATE FUNCTION audit.slow_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$ BEGIN
  IF EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands() WHERE object_identity = 'public.t' AND command_tag = 'ALTER TABLE') THEN
    PERFORM pg_sleep(2);
  END IF;
END $$`,
			"CREATE EVENT TRIGGER slow_ddl ON ddl_command_end EXECUTE FUNCTION audit.slow_ddl()",
		} {
			_, err := h.dstConn.Exec(ctx, q)
			require.NoError(h.t, err, q)
		}
		h.slowDDL = true
	}
	w := h.writing("the owner writing")
	owner := h.owner("cf")
	from := h.auditMark()
	_, err := h.srcConn.Exec(ctx, "ALTER TABLE t ADD COLUMN "+column+" text")
	require.NoError(h.t, err)

	// The owner's backend in the ALTER's sleep, holding the fence: freeze
	// the owner there.
	var pid int32
	testwait.Within(h.t, time.Minute, "the owner's ALTER TABLE on the target", func() bool {
		return h.dstConn.QueryRow(ctx, `SELECT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
WHERE a.wait_event = 'PgSleep' AND l.locktype = 'advisory' AND l.objsubid = 2 AND l.mode = 'ShareLock' AND l.granted`).Scan(&pid) == nil
	})
	h.signal(owner, syscall.SIGSTOP)
	frozen := time.Now()
	testwait.Within(h.t, time.Minute, "the frozen owner's backend idle in its transaction", func() bool {
		var state string
		return h.dstConn.QueryRow(ctx, "SELECT state FROM pg_stat_activity WHERE pid = $1", pid).Scan(&state) == nil &&
			state == "idle in transaction"
	})

	newWriter, at := h.writerAfter(from, w, 2*time.Minute)
	took := at.Sub(frozen)
	h.t.Logf("owner %s frozen inside a target transaction (backend %d): replicating again as %s on %s after %v", owner, pid, newWriter,
		h.owner("cf"), took.Round(10*time.Millisecond))
	require.Less(h.t, took, 30*time.Second, "a take-over held until the target's idle_in_transaction_session_timeout")
	var alive bool
	require.NoError(h.t, h.dstConn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&alive))
	require.False(h.t, alive, "the frozen owner's backend ended")

	h.signal(owner, syscall.SIGCONT)
	require.Error(h.t, h.nodes[owner].child.wait(), "the node thawed with its membership lost exits 1")
	h.startNode(owner)
	return took
}

// cutOwnerOff cuts owner off (do) for two TTLs, under the load: it
// requires that nothing moves (its membership is valid), and after heal
// that the target catches up with what was committed before it and that
// the owner is still there; it returns how long the catching up took.
func (h *clusterHarness) cutOwnerOff(owner, name string, do, heal func()) time.Duration {
	h.t.Helper()
	h.writing("the owner writing before it is " + name)
	do()
	began := time.Now()
	testwait.Within(h.t, 2*h.ttl+time.Minute, "two TTLs "+name, func() bool { return time.Since(began) >= 2*h.ttl })
	require.Equal(h.t, owner, h.owner("cf"), "moved while %s: its membership is valid", name)
	last := h.lastCommitted()
	heal()
	healed := time.Now()
	h.holds(last, 2*time.Minute)
	took := time.Since(healed)
	require.Equal(h.t, owner, h.owner("cf"), "moved after %s", name)
	select {
	case <-h.nodes[owner].child.exited:
		h.t.Fatalf("the owner exited after it was %s: %s", name, h.nodes[owner].child.stderr.String())
	default:
	}
	return took
}

// lastCommitted is the id of the load's last committed row (0: none).
func (h *clusterHarness) lastCommitted() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.committed) == 0 {
		return 0
	}
	return h.committed[len(h.committed)-1].id
}

// holds waits until the target holds the load's row id.
func (h *clusterHarness) holds(id int, within time.Duration) {
	h.t.Helper()
	testwait.Within(h.t, within, "the target holding the rows committed before", func() bool {
		var ok bool
		return h.dstConn.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM t WHERE id = $1)", id).Scan(&ok) == nil && ok
	})
}
