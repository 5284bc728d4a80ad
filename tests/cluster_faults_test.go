package tests

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/node"
	"github.com/cdcflow/eventservice/cmd/cdcserver/app/replicate"
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
	_, err := h.srcConn.Exec(t.Context(), "CREATE TABLE t (id int PRIMARY KEY, v text)")
	require.NoError(t, err)
	_, err = h.srcConn.Exec(t.Context(), "INSERT INTO t SELECT g, 'snapshot' FROM generate_series(1, 1000) g")
	require.NoError(t, err)
	h.auditTarget()
	for _, id := range []string{"n1", "n2", "n3"} {
		h.startNode(id)
	}
	require.Equal(t, http.StatusCreated, h.api("POST", "/api/v1/changefeeds", map[string]any{"name": "cf",
		"config": node.ChangefeedConfig{Source: h.src.DSN, Sink: h.dst.DSN}}, nil))
	h.equal("the snapshot")
	testwait.Within(t, time.Minute, "the snapshot recorded as applied", func() bool {
		var q struct {
			Status struct {
				Snapshot string `json:"snapshot"`
			} `json:"status"`
		}
		return h.api("GET", "/api/v1/changefeeds/cf", nil, &q) == http.StatusOK && q.Status.Snapshot == "applied"
	}) // a kill before it starts over, copying every table again (by design: a snapshot cannot be resumed)
	mark := h.auditMark()
	stop := h.load(1000)
	for kill := 1; kill <= 2; kill++ {
		owner := h.owner("cf")
		require.NotEmpty(t, owner)
		from := h.auditMark()
		var writer string
		testwait.Within(t, time.Minute, "the owner writing the load", func() bool {
			return h.dstConn.QueryRow(t.Context(), "SELECT writer FROM audit.log WHERE seq > $1 ORDER BY seq DESC LIMIT 1", from).Scan(&writer) == nil
		})
		h.kill(owner)
		killed := time.Now()
		newWriter, at := h.writerAfter(from, writer, 2*time.Minute)
		t.Logf("kill %d of %s (writer %s): replicating again as %s on %s after %v", kill, owner, writer, newWriter, h.owner("cf"),
			at.Sub(killed).Round(10*time.Millisecond))
		require.NotEqual(t, owner, h.owner("cf"))
		h.startNode(owner) // back, as a new member
	}
	last := stop()
	h.equal("after the kills")
	v := h.audit(mark, 1000)
	t.Logf("audit: %d rows loaded, lost %d, written twice %d, writers %s, overlaps %d", last-1000, v.Lost, v.Twice, strings.Join(v.Writers, " "), v.Overlaps)
	require.Zero(t, v.Lost, "rows lost")
	require.Zero(t, v.Twice, "rows written twice")
	require.Zero(t, v.Overlaps, "commits of an older writer after a newer one's first")
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
