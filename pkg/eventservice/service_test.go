package eventservice

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

func TestEndToEndRowsDDLsAndResolved(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	id := h.register(1, 10)
	st := h.check.waitResolved(id, 10)
	require.Equal(t, common.Ts(10), st.startTs)

	require.NoError(t, h.schema.AddDDL(schemastore.DDL{TableID: 1, CommitTs: 20, Query: "alter 20"}))
	require.NoError(t, h.schema.AddDDL(schemastore.DDL{TableID: 1, CommitTs: 25, Query: "alter 25"}))
	h.advanceSchema(100)
	h.push(1, 40, row("a", 15, 20), row("b", 16, 20), row("c", 21, 30))
	st = h.check.waitResolved(id, 40)
	require.Equal(t, []string{"a", "b", "c"}, keys(st.rows))
	require.Len(t, st.ddls, 2)
	require.Equal(t, common.Ts(20), st.ddls[0].CommitTs)

	// Resolved-only advance: the fast path, no scan.
	before := h.svc.metrics.prepareOutcomes[outcomeScan]
	_ = before
	h.push(1, 60)
	h.check.waitResolved(id, 60)
}
