package dueheap

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPopDueEarliestFirst(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var h Heap[string]
	_, ok := h.Peek()
	require.False(t, ok)
	h.Push(t0.Add(3*time.Second), "c")
	h.Push(t0.Add(time.Second), "a")
	h.Push(t0.Add(2*time.Second), "b")
	h.Push(t0.Add(time.Second), "a2")
	first, ok := h.Peek()
	require.True(t, ok)
	require.Equal(t, t0.Add(time.Second), first.Due)
	require.Empty(t, h.PopDue(t0, nil), "nothing due yet")
	got := h.PopDue(t0.Add(2*time.Second), nil)
	require.Len(t, got, 3)
	require.ElementsMatch(t, []string{"a", "a2"}, []string{got[0].Item, got[1].Item})
	require.Equal(t, "b", got[2].Item)
	require.Equal(t, 1, h.Len())
	require.Equal(t, "c", h.PopDue(t0.Add(time.Hour), nil)[0].Item)
	require.Zero(t, h.Len())
}
