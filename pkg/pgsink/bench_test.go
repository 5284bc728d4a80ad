package pgsink

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/internal/proccpu"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// BenchmarkLaneCommit measures the sink's lanes against a real PostgreSQL
// 15 target in the shape of `make pgbench`'s live load at 1000 tables:
// each op hands the sink one row (an insert, or an update of the row
// before it) for each of `touched` tables with its checkpoint, and ends
// when every one of them is durable. At 1000 tables a changefeed that
// keeps up gives each table about one row per lane commit, so what a row
// costs here is a statement's: the lane's encoding and pipelining on this
// side (`client-µs/row`: this process's CPU, the benchmark's own feeding
// included) and the statement's execution in the target (`target-µs/row`:
// the postmaster's and its backends' CPU).
func BenchmarkLaneCommit(b *testing.B) {
	for _, shape := range []struct{ tables, touched int }{{1000, 200}, {100, 100}} {
		b.Run(fmt.Sprintf("tables=%d/touched=%d", shape.tables, shape.touched), func(b *testing.B) {
			benchLaneCommit(b, shape.tables, shape.touched)
		})
	}
}

func benchLaneCommit(b *testing.B, tables, touched int) {
	pg := pgtest.Start(b)
	ctx := context.Background()
	// The lanes' cadence is short so that the op's wall time is mostly
	// work; it is not what is measured.
	s, err := New(Options{DSN: pg.DSN, Workers: 4, FlushInterval: 2 * time.Millisecond, MaxFlushInterval: 2 * time.Millisecond,
		CheckpointInterval: 2 * time.Millisecond, Logger: zaptest.NewLogger(b, zaptest.Level(zap.WarnLevel))})
	require.NoError(b, err)
	dur := newDurables()
	s.SetDurable(dur.record)
	require.NoError(b, s.Start(ctx))
	defer s.Close()
	ids := make([]common.DispatcherID, tables)
	bs := make([]Binding, tables)
	for i := range tables {
		ids[i] = common.DispatcherIDFromUint64(uint64(i + 1))
		bs[i] = Binding{ID: ids[i], StartTs: 1, Rel: pgcodec.Relation{OID: uint32(1000 + i), Schema: "public", Name: "t" + strconv.Itoa(i),
			Columns: []pgcodec.Column{{Name: "id", Type: "bigint", TypeOID: 20, Key: true}, {Name: "n", Type: "integer", TypeOID: 23},
				{Name: "v", Type: "text", TypeOID: 25}}}}
	}
	require.NoError(b, s.BindAll(ctx, bs))
	for _, id := range ids {
		require.NoError(b, s.BeginEpoch(id, 1, 1))
	}
	postmaster, err := pg.PostmasterPID()
	require.NoError(b, err)
	value := []byte("a value of about the size pgbench writes, forty")
	ts := common.Ts(1)
	next := 0
	op := func() {
		ts++
		first := next
		for k := range touched {
			i := (first + k) % tables
			id := strconv.Itoa(int(ts) / 2)
			change := pgcodec.Insert
			if ts%2 == 1 {
				change = pgcodec.Update // of the row the op before inserted
			}
			c := pgcodec.RowChange{Change: change, Columns: []pgcodec.Datum{
				{Name: "id", Kind: pgcodec.Text, Text: []byte(id)}, {Name: "n", Kind: pgcodec.Text, Text: []byte("7")},
				{Name: "v", Kind: pgcodec.Text, Text: value}}}
			row := common.Row{Op: pgcodec.Op(change), Key: pgcodec.AppendKey(nil, uint32(i), [][]byte{[]byte(id)}),
				Value: pgcodec.AppendValue(nil, c), StartTs: ts - 1, CommitTs: ts}
			require.NoError(b, s.ApplyRows(ids[i], []common.Row{row}))
			require.NoError(b, s.Checkpoint(ids[i], ts))
		}
		for k := range touched {
			dur.wait(b, ids[(first+k)%tables], ts)
		}
		if ts%2 == 1 {
			next = (next + touched) % tables
		}
	}
	for range 20 { // every statement prepared, every table warm
		op()
	}
	selfBefore := rusage(b)
	targetBefore, err := proccpu.Tree(postmaster)
	require.NoError(b, err)
	b.ResetTimer()
	for range b.N {
		op()
	}
	b.StopTimer()
	targetAfter, err := proccpu.Tree(postmaster)
	require.NoError(b, err)
	rows := float64(b.N * touched)
	b.ReportMetric(rows/b.Elapsed().Seconds(), "rows/s")
	b.ReportMetric(float64((rusage(b)-selfBefore).Nanoseconds())/1e3/rows, "client-µs/row")
	b.ReportMetric(float64((targetAfter-targetBefore).Nanoseconds())/1e3/rows, "target-µs/row")
}

// rusage is this process's CPU time so far.
func rusage(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
