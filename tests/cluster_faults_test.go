package tests

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/replicate"
	"github.com/cdcflow/eventservice/internal/faultproxy"
	"github.com/cdcflow/eventservice/internal/testwait"
)

// kill -9 of the node that runs a changefeed, under a steady load, twice:
// the changefeed replicates again on another node (its first commit to
// the target by a new writer) within the TTL and a few seconds, and after
// quiescing the target equals the source with no row lost or written
// twice, and no commit of an older writer after the first of a newer
// (the audit of every target write). The short version of the fault
// suite's kill; make chaos runs it longer.
func TestClusterKillTheOwningNode(t *testing.T) {
	const ttl = 3 * time.Second
	h := newClusterHarness(t, ttl)
	mark := h.startChangefeed(1000)
	stop := h.load(1000)
	for kill := 1; kill <= 2; kill++ {
		owner := h.owner("cf")
		require.NotEmpty(t, owner)
		from := h.auditMark()
		writer := h.writing("the owner writing the load")
		h.kill(owner)
		killed := time.Now()
		newWriter, at := h.writerAfter(from, writer, 2*time.Minute)
		t.Logf("kill %d of %s (writer %s): replicating again as %s on %s after %v", kill, owner, writer, newWriter, h.owner("cf"),
			at.Sub(killed).Round(10*time.Millisecond))
		require.NotEqual(t, owner, h.owner("cf"))
		h.startNode(owner) // back, as a new member
	}
	v := h.quiesced(stop, mark, 1000)
	require.GreaterOrEqual(t, len(v.Writers), 3, "a writer per owner")
}

// equal waits until compare finds the source and target equal.
func (h *clusterHarness) equal(what string) {
	h.t.Helper()
	var out strings.Builder
	var err error
	if testwait.Until(3*time.Minute, func() bool {
		out.Reset()
		err = replicate.Compare(h.t.Context(), h.src.DSN, h.dst.DSN, "cf", &out)
		return err == nil
	}) {
		return
	}
	h.t.Fatalf("%s: never equal: %v\n%s", what, err, out.String())
}

// The fault suite's short schedule, one cluster under a steady load, each
// fault in turn, then the audit of every target write:
//   - kill -9 of the coordinator (when it does not run the changefeed,
//     another node takes over the coordinator within about a TTL);
//   - SIGSTOP of the owning node for two TTLs: another node takes the
//     changefeed over; at SIGCONT the frozen node finds its membership
//     lost and exits (1), writing nothing (the audit's overlaps);
//   - the owner frozen, then cut off from etcd, for a third of a TTL:
//     nothing moves, the node stays;
//   - one of three etcd members killed for two TTLs: nothing moves (the
//     same writer throughout), and the member comes back;
//   - a rolling restart (SIGTERM, each node drains and exits 0, then
//     starts again): the changefeed moves without waiting for a lease;
//   - etcd's quorum lost for two TTLs: every node exits (1), nothing is
//     written, and with the members back and the nodes started again
//     the changefeed runs again.
//
// After quiescing: equal, no row lost or written twice, no commit of an
// older writer after a newer one's first; and throughout, the slot's
// confirmed position never ahead of the rows the target holds (sampled).
func TestClusterFaultSchedule(t *testing.T) {
	const ttl = 3 * time.Second
	h := newClusterHarness(t, ttl)
	ctx := t.Context()
	ids := []string{"n1", "n2", "n3"}
	mark := h.startChangefeed(0)
	stop := h.load(0)
	stopSlotCheck := h.checkSlot("cf")
	writing := h.writing
	writing("the first writes")

	// The coordinator killed.
	coord, owner := h.coordinator(), h.owner("cf")
	require.NotEmpty(t, coord)
	if coord == owner { // the other faults cover the owner: move it off, then kill a coordinator that only coordinates
		require.Equal(t, http.StatusOK, h.api("POST", "/api/v1/nodes/"+coord+"/drain", nil, nil))
		testwait.Within(t, time.Minute, "the changefeed off the coordinator", func() bool { o := h.owner("cf"); return o != "" && o != coord })
	}
	h.kill(coord)
	killed := time.Now()
	testwait.Within(t, time.Minute, "another coordinator", func() bool { c := h.coordinator(); return c != "" && c != coord })
	t.Logf("coordinator %s killed: %s coordinates after %v", coord, h.coordinator(), time.Since(killed).Round(10*time.Millisecond))
	h.startNode(coord)

	// The owner frozen for two TTLs.
	w := writing("writes before the freeze")
	owner = h.owner("cf")
	from := h.auditMark()
	h.signal(owner, syscall.SIGSTOP)
	frozen := time.Now()
	newWriter, at := h.writerAfter(from, w, time.Minute)
	t.Logf("owner %s frozen: replicating again as %s after %v", owner, newWriter, at.Sub(frozen).Round(10*time.Millisecond))
	if d := 2*ttl - time.Since(frozen); d > 0 {
		testwait.Within(t, d+time.Minute, "two TTLs frozen", func() bool { return time.Since(frozen) >= 2*ttl })
	}
	h.signal(owner, syscall.SIGCONT)
	err := h.nodes[owner].child.wait()
	require.Error(t, err, "the node thawed with its membership lost exits 1")
	require.Contains(t, h.nodes[owner].child.stderr.String(), "lease")
	h.startNode(owner)

	// Pauses shorter than the deadline move nothing: the owner frozen for
	// a third of the TTL, then cut off from etcd (both ways) for as long.
	w = writing("writes before the short faults")
	owner = h.owner("cf")
	from = h.auditMark()
	for _, short := range []struct {
		name      string
		do, after func()
	}{
		{"frozen", func() { h.signal(owner, syscall.SIGSTOP) }, func() { h.signal(owner, syscall.SIGCONT) }},
		{"cut off from etcd", func() { // a silent link, both ways (a Partition also resets: see docs/design/cluster.md)
			for _, px := range h.nodes[owner].etcd {
				px.Hold(faultproxy.Upstream)
				px.Hold(faultproxy.Downstream)
			}
		}, func() {
			for _, px := range h.nodes[owner].etcd {
				px.Release()
			}
		}},
	} {
		short.do()
		began := time.Now()
		testwait.Within(t, time.Minute, "a third of a TTL "+short.name, func() bool { return time.Since(began) >= ttl/3 })
		short.after()
		writing("writes after the owner was " + short.name + " briefly")
	}
	require.Equal(t, owner, h.owner("cf"), "moved after a short fault")
	var movedOn int
	require.NoError(t, h.dstConn.QueryRow(ctx, "SELECT count(*) FROM audit.log WHERE seq > $1 AND writer <> $2", from, w).Scan(&movedOn))
	require.Zero(t, movedOn, "another writer after a short fault")
	select {
	case <-h.nodes[owner].child.exited:
		t.Fatalf("the owner exited after a short fault: %s", h.nodes[owner].child.stderr.String())
	default:
	}

	// One etcd member lost for two TTLs: nothing moves.
	w = writing("writes before the member's loss")
	owner = h.owner("cf")
	from = h.auditMark()
	h.killMember(0)
	lost := time.Now()
	testwait.Within(t, time.Minute, "two TTLs without the member", func() bool { return time.Since(lost) >= 2*ttl })
	require.Equal(t, owner, h.owner("cf"), "moved without its member")
	var others int
	require.NoError(t, h.dstConn.QueryRow(ctx, "SELECT count(*) FROM audit.log WHERE seq > $1 AND writer <> $2", from, w).Scan(&others))
	require.Zero(t, others, "another writer while a member was lost")
	h.startMember(0)

	// A rolling restart.
	for _, id := range ids {
		before := h.owner("cf")
		w = writing("writes before " + id + "'s restart")
		from = h.auditMark()
		h.signal(id, syscall.SIGTERM)
		stopped := time.Now()
		require.NoError(t, h.nodes[id].child.wait(), "%s's clean stop: %s", id, h.nodes[id].child.stderr.String())
		if before == id {
			newWriter, at = h.writerAfter(from, w, time.Minute)
			t.Logf("rolling restart of %s, the owner: replicating again as %s %v after its SIGTERM", id, newWriter, at.Sub(stopped).Round(10*time.Millisecond))
		}
		h.startNode(id)
	}

	// etcd's quorum lost (two of three members killed) for two TTLs:
	// every node's membership is lost at its deadline, and every node
	// exits (1); nothing is written without one; with the members back
	// and the nodes started again, the changefeed runs again.
	w = writing("writes before the quorum's loss")
	h.killMember(0)
	h.killMember(1)
	lost = time.Now()
	for _, id := range ids {
		require.Error(t, h.nodes[id].child.wait(), "%s exits 1 without a quorum", id)
	}
	t.Logf("quorum lost: every node exited after %v", time.Since(lost).Round(10*time.Millisecond))
	quiet := h.auditMark()
	testwait.Within(t, 2*ttl+time.Minute, "two TTLs without a quorum", func() bool { return time.Since(lost) >= 2*ttl })
	require.Equal(t, quiet, h.auditMark(), "nothing written without a quorum")
	h.startMember(0)
	h.startMember(1)
	for _, id := range ids {
		h.startNode(id)
	}
	newWriter, at = h.writerAfter(quiet, w, 2*time.Minute)
	t.Logf("quorum back: replicating again as %s", newWriter)

	h.quiesced(stop, mark, 0)
	samples, checked, missing := stopSlotCheck()
	t.Logf("slot checker: %d samples of the confirmed position, %d rows checked behind them, %d missing", samples, checked, missing)
	require.Positive(t, checked, "rows behind a confirmed position")
	require.Zero(t, missing, "rows at or before the slot's confirmed position missing from the target")
}

// The owner cut off from etcd, both ways (its connections reset and
// refused) and then, after it was started again, one way (etcd's replies
// held, its requests passing): each time the cut-off node finds its
// local deadline passed, sends nothing more and exits (1), and another
// node takes the changefeed over once the lease expired. After quiescing:
// equal, nothing lost or written twice, no commit of an older writer
// after a newer one's first.
func TestClusterOwnerCutOffFromEtcd(t *testing.T) {
	const ttl = 3 * time.Second
	h := newClusterHarness(t, ttl)
	mark := h.startChangefeed(0)
	stop := h.load(0)
	for _, cut := range []struct {
		name string
		do   func(p *faultproxy.Proxy)
		heal func(p *faultproxy.Proxy)
	}{
		{"both ways", (*faultproxy.Proxy).Partition, (*faultproxy.Proxy).Heal},
		{"etcd's replies held", func(p *faultproxy.Proxy) { p.Hold(faultproxy.Downstream) }, (*faultproxy.Proxy).Release},
	} {
		from := h.auditMark()
		w := h.writing("the owner writing")
		owner := h.owner("cf")
		for _, px := range h.nodes[owner].etcd {
			cut.do(px)
		}
		at := time.Now()
		newWriter, seen := h.writerAfter(from, w, time.Minute)
		err := h.nodes[owner].child.wait()
		require.Error(t, err, "%s: the cut-off node exits 1", cut.name)
		require.Contains(t, h.nodes[owner].child.stderr.String(), "lease")
		t.Logf("%s cut off from etcd %s: replicating again as %s after %v; the node exited after %v (its runs' clean stops)", owner,
			cut.name, newWriter, seen.Sub(at).Round(10*time.Millisecond), time.Since(at).Round(10*time.Millisecond))
		for _, px := range h.nodes[owner].etcd {
			cut.heal(px)
		}
		h.startNode(owner)
	}
	h.quiesced(stop, mark, 0)
}
