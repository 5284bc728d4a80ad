package eventcollector

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

func TestMetricsLintValuesAndRegistration(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	h := newCrafted(t, nil, func(o *Options) { o.Registerer = reg })
	start := common.TsFromTime(t0.Add(-5 * time.Second))
	id := did(1)
	require.NoError(t, h.coll.AddDispatcher(context.Background(), id, common.TableSpan(1), start))
	h.deliver(handshake(id, 1, start), dml(id, 1, 2, false, row("a", start+1, start+2), row("b", start+1, start+2)),
		resolved(id, 1, 2, common.TsFromTime(t0.Add(-3*time.Second))), resolved(id, 1, 1, start+1), dml(id, 1, 4, false, row("c", start+3, start+4)))
	h.svc.nextReset(t)
	h.deliver(handshake(did(7), 1, 1))

	problems, err := testutil.CollectAndLint(h.coll.metrics)
	require.NoError(t, err)
	require.Empty(t, problems)
	problems, err = testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)

	const want = `
# HELP cdcflow_eventcollector_checkpoint_lag_seconds Physical lag of the smallest dispatcher checkpoint; zero with no dispatchers.
# TYPE cdcflow_eventcollector_checkpoint_lag_seconds gauge
cdcflow_eventcollector_checkpoint_lag_seconds{target="collector-test"} 3
# HELP cdcflow_eventcollector_dispatchers Dispatchers of the collector.
# TYPE cdcflow_eventcollector_dispatchers gauge
cdcflow_eventcollector_dispatchers{target="collector-test"} 1
# HELP cdcflow_eventcollector_ignored_messages_total Messages ignored: of an older epoch, a resolved-ts overtaken by later messages, of an earlier registration of the dispatcher, of an unknown dispatcher, or a resolved-ts batch of no or too many entries.
# TYPE cdcflow_eventcollector_ignored_messages_total counter
cdcflow_eventcollector_ignored_messages_total{reason="invalid_batch",target="collector-test"} 0
cdcflow_eventcollector_ignored_messages_total{reason="stale_epoch",target="collector-test"} 0
cdcflow_eventcollector_ignored_messages_total{reason="stale_registration",target="collector-test"} 0
cdcflow_eventcollector_ignored_messages_total{reason="stale_resolved",target="collector-test"} 1
cdcflow_eventcollector_ignored_messages_total{reason="unknown_dispatcher",target="collector-test"} 1
# HELP cdcflow_eventcollector_messages_received_total Messages received from the inbox, by kind.
# TYPE cdcflow_eventcollector_messages_received_total counter
cdcflow_eventcollector_messages_received_total{kind="ddl",target="collector-test"} 0
cdcflow_eventcollector_messages_received_total{kind="dml",target="collector-test"} 2
cdcflow_eventcollector_messages_received_total{kind="handshake",target="collector-test"} 2
cdcflow_eventcollector_messages_received_total{kind="resolved",target="collector-test"} 2
cdcflow_eventcollector_messages_received_total{kind="resolved_batch",target="collector-test"} 0
# HELP cdcflow_eventcollector_resets_total Dispatcher resets, by reason.
# TYPE cdcflow_eventcollector_resets_total counter
cdcflow_eventcollector_resets_total{reason="before_handshake",target="collector-test"} 0
cdcflow_eventcollector_resets_total{reason="duplicate_handshake",target="collector-test"} 0
cdcflow_eventcollector_resets_total{reason="epoch",target="collector-test"} 0
cdcflow_eventcollector_resets_total{reason="gap",target="collector-test"} 1
cdcflow_eventcollector_resets_total{reason="invalid",target="collector-test"} 0
cdcflow_eventcollector_resets_total{reason="sink_error",target="collector-test"} 0
# HELP cdcflow_eventcollector_rows_applied_total Rows the sink accepted, re-deliveries after a reset included.
# TYPE cdcflow_eventcollector_rows_applied_total counter
cdcflow_eventcollector_rows_applied_total{target="collector-test"} 2
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
		"cdcflow_eventcollector_checkpoint_lag_seconds", "cdcflow_eventcollector_dispatchers",
		"cdcflow_eventcollector_ignored_messages_total", "cdcflow_eventcollector_messages_received_total",
		"cdcflow_eventcollector_resets_total", "cdcflow_eventcollector_rows_applied_total"))
	n, err := testutil.GatherAndCount(reg, "cdcflow_eventcollector_sink_duration_seconds")
	require.NoError(t, err)
	require.Equal(t, 4, n, "one histogram per sink operation")
	n, err = testutil.GatherAndCount(reg, "cdcflow_eventcollector_service_calls_total")
	require.NoError(t, err)
	require.Equal(t, 6, n)

	// A second collector of the same target collides; another target does
	// not; Close frees the name.
	inbox2, err := h.inproc.Register("collector-2")
	require.NoError(t, err)
	c2, err := New(Options{Service: h.svc, Inbox: inbox2, Target: "collector-2", Sink: NewMemorySink(), Registerer: reg})
	require.NoError(t, err, "another target shares the registry")
	defer func() { require.NoError(t, c2.Close()) }()
	inboxSame, err := h.inproc.Register("collector-3")
	require.NoError(t, err)
	c3, err := New(Options{Service: h.svc, Inbox: inboxSame, Sink: NewMemorySink(), Registerer: reg})
	require.NoError(t, err)
	require.NoError(t, c3.Close())
	c3, err = New(Options{Service: h.svc, Inbox: inboxSame, Sink: NewMemorySink(), Registerer: reg})
	require.NoError(t, err, "the name is free again after Close")
	_, err = New(Options{Service: h.svc, Inbox: inboxSame, Sink: NewMemorySink(), Registerer: reg})
	var are prometheus.AlreadyRegisteredError
	require.True(t, errors.As(err, &are), "%v", err)
	require.NoError(t, c3.Close())
}

func TestStatsSnapshot(t *testing.T) {
	h := newCrafted(t, nil, nil)
	require.Zero(t, h.coll.Stats().MinCheckpoint)
	a := h.addAndHandshake(1, 10)
	b := h.addAndHandshake(2, 20)
	h.deliver(dml(a, 1, 2, false, row("a", 15, 20)), resolved(a, 1, 2, 30), resolved(b, 1, 1, 25))
	st := h.coll.Stats()
	require.Equal(t, 2, st.Dispatchers)
	require.Equal(t, common.Ts(25), st.MinCheckpoint)
	require.Equal(t, uint64(1), st.RowsApplied)
	require.Equal(t, [numKinds]uint64{2, 1, 0, 2}, st.Messages)
	require.Equal(t, uint64(1), st.Messages[messaging.KindDMLBatch-1])
}
