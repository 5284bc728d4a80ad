package eventservice

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// sendRecorderForTest passes every Send through to the transport it wraps
// and records, for each call that carried rows, the rows of its DMLBatch
// messages (a scan task is sent in one call).
type sendRecorderForTest struct {
	inner messaging.Transport
	mu    sync.Mutex
	tasks [][]common.Row
}

func (r *sendRecorderForTest) Send(to messaging.Target, msgs []messaging.Message) error {
	var rows []common.Row
	for _, m := range msgs {
		if dml, ok := m.(*messaging.DMLBatch); ok {
			for _, row := range dml.Rows {
				rows = append(rows, row.Clone())
			}
		}
	}
	err := r.inner.Send(to, msgs)
	if err == nil && len(rows) > 0 {
		r.mu.Lock()
		r.tasks = append(r.tasks, rows)
		r.mu.Unlock()
	}
	return err
}

func (r *sendRecorderForTest) sent() [][]common.Row {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]common.Row(nil), r.tasks...)
}

// TestAScanTaskStopsAtTheFirstTransactionBoundaryPastTheByteLimit: a scan
// task is bounded by bytes as well as by rows. With a row limit no task
// reaches, every task ends at the first transaction boundary at which its
// rows reached ScanLimitBytes: the bytes before its last transaction are
// below the limit, and (unless the range ended) the task's rows are at or
// above it. The rows are 40 bytes, one transaction each, and the limit 64,
// so every task but the last carries exactly two rows, and the stream is
// complete. All the rows reach the store in one batch with its resolved-ts
// (one notification), so the first task could read all of them: only the
// byte limit splits them.
func TestAScanTaskStopsAtTheFirstTransactionBoundaryPastTheByteLimit(t *testing.T) {
	const limit, rowBytes, n = 64, 40, 7
	var rec *sendRecorderForTest
	h := newHarness(t, func(o *Options) {
		o.ScanLimitRows, o.ScanLimitBytes = 1<<20, limit
		rec = &sendRecorderForTest{inner: o.Transport}
		o.Transport = rec
	}, hooks{})
	h.advanceSchema(1 << 40)
	id := h.register(1, 10)
	h.check.waitResolved(id, 10)

	var rows []common.Row
	var want []string
	for i := range n {
		key := fmt.Sprintf("row-%02d", i)
		r := common.Row{Op: common.OpPut, Key: []byte(key), Value: bytes.Repeat([]byte{'v'}, rowBytes-len(key)),
			StartTs: common.Ts(20 + 2*i), CommitTs: common.Ts(21 + 2*i)}
		require.Equal(t, rowBytes, r.Size())
		rows = append(rows, r)
		want = append(want, key)
	}
	h.push(1, 50, rows...)
	es := h.check.waitResolved(id, 50)
	require.Equal(t, want, keys(es.rows), "every row arrives once, in order")

	tasks := rec.sent()
	for i, task := range tasks {
		total := 0
		for _, r := range task {
			total += r.Size()
		}
		last := task[len(task)-1] // each row is a transaction of its own
		require.Less(t, total-last.Size(), limit, "task %d (%v) went on past the byte limit", i, keys(task))
		if i < len(tasks)-1 {
			require.GreaterOrEqual(t, total, limit, "task %d (%v) stopped before the byte limit", i, keys(task))
		}
	}
	var got [][]string
	for _, task := range tasks {
		got = append(got, keys(task))
	}
	require.Equal(t, [][]string{{"row-00", "row-01"}, {"row-02", "row-03"}, {"row-04", "row-05"}, {"row-06"}}, got)
	require.Positive(t, testutilCounter(h.svc.metrics.interruptedScans))
}
