package eventservice

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func sessionsForQueueTest(n int) []*session {
	ss := make([]*session, n)
	for i := range ss {
		d := &dispatcher{}
		ss[i] = &d.first
		ss[i].d = d
	}
	return ss
}

func popAll(q *prepareQueue, batch int) []*session {
	var out []*session
	dst := make([]*session, batch)
	for {
		n := q.popMany(dst)
		if n == 0 {
			return out
		}
		out = append(out, dst[:n]...)
	}
}

// TestPrepareQueueIsAFIFOOfDistinctSessions: sessions come out in the
// order they were pushed, each once however often it was pushed while
// queued, across batches smaller and larger than the touch-ahead chunk and
// across the ring's growth.
func TestPrepareQueueIsAFIFOOfDistinctSessions(t *testing.T) {
	ss := sessionsForQueueTest(1000)
	for _, batch := range []int{1, 7, 256, 2000} {
		q := newPrepareQueue()
		for _, s := range ss {
			require.True(t, q.push(s))
			require.False(t, q.push(s), "a queued session is not queued twice")
		}
		require.Equal(t, len(ss), q.len())
		require.Equal(t, ss, popAll(q, batch), "batch %d", batch)
		require.Zero(t, q.len())
		for _, s := range ss {
			require.False(t, s.queued)
		}
	}
}

// TestPrepareQueueUnlinkLeavesNoTrace: an unlinked session is not popped;
// pushed again, it goes to the tail, once; the others keep their order.
func TestPrepareQueueUnlinkLeavesNoTrace(t *testing.T) {
	ss := sessionsForQueueTest(5)
	q := newPrepareQueue()
	for _, s := range ss {
		q.push(s)
	}
	q.unlink(ss[1])
	q.unlink(ss[3])
	q.unlink(ss[3]) // not queued: nothing
	require.Equal(t, 3, q.len())
	require.False(t, q.contains(ss[1]))
	require.True(t, q.push(ss[1]))
	require.Equal(t, []*session{ss[0], ss[2], ss[4], ss[1]}, popAll(q, 2))
	require.Nil(t, q.pop())
}

// TestPrepareQueueStaysBoundedUnderChurn: sessions pushed and unlinked
// again and again, never popped, leave stale entries; the ring is
// compacted rather than grown, so its length stays within four times the
// most sessions queued at once plus twice the slack, and what is left to
// pop is exactly what is queued, in order.
func TestPrepareQueueStaysBoundedUnderChurn(t *testing.T) {
	ss := sessionsForQueueTest(100)
	q := newPrepareQueue()
	rng := rand.New(rand.NewPCG(1, 2))
	var order []*session // what should come out, oldest first
	for range 100_000 {
		s := ss[rng.IntN(len(ss))]
		if s.queued {
			q.unlink(s)
			for i, o := range order {
				if o == s {
					order = append(order[:i], order[i+1:]...)
					break
				}
			}
		} else {
			q.push(s)
			order = append(order, s)
		}
		require.LessOrEqual(t, len(q.mu.ring), max(16, 4*len(ss)+2*queueSlack), "the ring grew past its bound")
	}
	require.Equal(t, len(order), q.len())
	require.Equal(t, order, popAll(q, 3))
}

// TestPrepareQueueCloseEmptiesAndRefuses: close unqueues every session and
// refuses pushes from then on.
func TestPrepareQueueCloseEmptiesAndRefuses(t *testing.T) {
	ss := sessionsForQueueTest(40)
	q := newPrepareQueue()
	for _, s := range ss {
		q.push(s)
	}
	q.unlink(ss[5])
	q.close()
	require.Zero(t, q.len())
	for _, s := range ss {
		require.False(t, s.queued)
	}
	require.False(t, q.push(ss[0]))
	require.Nil(t, q.pop())
}
