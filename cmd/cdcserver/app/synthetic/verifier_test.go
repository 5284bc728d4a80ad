package synthetic

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pebblesink"
)

// TestVerifierReportsOrderViolationOnKeyThatPrefixesAnother applies key
// "a" at a later commit-ts t2 before the earlier t1, with a key that "a"
// prefixes stored too: "a" + t1's first 7 bytes + 0xFF, which in the raw
// layout sorted between "a"@t1 and "a"@t2, so the neighbour check never
// compared them.
func TestVerifierReportsOrderViolationOnKeyThatPrefixesAnother(t *testing.T) {
	t1, t2 := common.ComposeTs(1_700_000_000_000, 0), common.ComposeTs(1_700_000_000_001, 0)
	a1 := common.Row{Key: []byte("a"), CommitTs: t1, Op: common.OpPut, Value: []byte("1")}
	a2 := common.Row{Key: []byte("a"), CommitTs: t2, Op: common.OpPut, Value: []byte("2")}
	otherKey := append(append([]byte("a"), binary.BigEndian.AppendUint64(nil, uint64(t1))[:7]...), 0xFF)
	other := common.Row{Key: otherKey, CommitTs: t1, Op: common.OpPut, Value: []byte("x")}
	raw := func(r common.Row) []byte {
		return binary.BigEndian.AppendUint64(bytes.Clone(r.Key), uint64(r.CommitTs))
	}
	require.True(t, bytes.Compare(raw(a1), raw(other)) < 0 && bytes.Compare(raw(other), raw(a2)) < 0,
		"the fixture: in the raw layout the other key sorts between a's versions")
	want := []common.Row{a1, other, a2}
	d := dispatcherRef{id: common.DispatcherIDFromUint64(1), table: 3}

	t.Run("through the sink", func(t *testing.T) {
		s, err := pebblesink.Open(t.TempDir())
		require.NoError(t, err)
		defer func() { require.NoError(t, s.Close()) }()
		s.Bind(d.id, d.table)
		for i, r := range []common.Row{a2, other, a1} { // a1 applied after a2: a violation
			require.NoError(t, s.ApplyRows(d.id, []common.Row{r}))
			require.NoError(t, s.Checkpoint(d.id, common.Ts(i+1)))
		}
		versions, err := s.Versions(d.table)
		require.NoError(t, err)
		var sum Summary
		verifyVersions(&sum, d, want, versions, window{final: t2, certified: t2})
		require.Equal(t, 1, sum.OrderViolations, "%v", sum.Problems)
		require.Zero(t, sum.MissingRows+sum.UnexpectedRows+sum.Duplicates)
	})
	t.Run("versions in the raw layout's order", func(t *testing.T) {
		// What the raw layout's scan returned: the verifier must not rely
		// on the scan order to find one key's versions.
		versions := []pebblesink.Version{
			{Key: a1.Key, CommitTs: t1, Seq: 3, Op: common.OpPut, Value: a1.Value},
			{Key: other.Key, CommitTs: t1, Seq: 2, Op: common.OpPut, Value: other.Value},
			{Key: a2.Key, CommitTs: t2, Seq: 1, Op: common.OpPut, Value: a2.Value},
		}
		var sum Summary
		verifyVersions(&sum, d, want, versions, window{final: t2, certified: t2})
		require.Equal(t, 1, sum.OrderViolations, "%v", sum.Problems)
	})
}
