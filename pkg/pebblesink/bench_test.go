package pebblesink

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
)

// BenchmarkCheckpointBatch applies rows as a collector process does: 64
// dispatchers of one table each, 64 new rows of 100-byte values staged per
// dispatcher (4-row transactions, one commit-ts each), then one
// CheckpointBatch over all of them. One op is one row written; rows/s is
// the figure to compare. The values are pseudo-random, as the generator's
// are (zeros would measure how well snappy shrinks them): a pool of
// distinct ones, far more than a block holds, taken in turn.
func BenchmarkCheckpointBatch(b *testing.B) {
	const dispatchers, rowsPer, txnRows, valueBytes = 64, 64, 4, 100
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ids := make([]common.DispatcherID, dispatchers)
	cps := make([]eventcollector.SinkCheckpoint, dispatchers)
	errs := make([]error, dispatchers)
	for i := range ids {
		ids[i] = common.DispatcherIDFromUint64(uint64(i + 1))
		s.Bind(ids[i], int64(i+1))
	}
	rows := make([]common.Row, rowsPer)
	keys := make([][]byte, rowsPer) // each row a new version of its key: the commit-ts moves
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%08d", i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	values := make([][]byte, 4096)
	for i := range values {
		values[i] = make([]byte, valueBytes)
		for j := range values[i] {
			values[i][j] = byte(rng.Uint32())
		}
	}
	next := 0
	ts := common.Ts(0)
	b.SetBytes(valueBytes)
	b.ResetTimer()
	cpu0 := processCPU(b)
	for written := 0; written < b.N; written += dispatchers * rowsPer {
		for i := range rows {
			if i%txnRows == 0 {
				ts++
			}
			rows[i] = common.Row{Op: common.OpPut, Key: keys[i], Value: values[next],
				StartTs: ts - 1, CommitTs: ts}
			next = (next + 1) % len(values)
		}
		for i, id := range ids {
			if err := s.ApplyRows(id, rows); err != nil {
				b.Fatal(err)
			}
			cps[i] = eventcollector.SinkCheckpoint{ID: id, Ts: ts}
		}
		clear(errs)
		s.CheckpointBatch(cps, errs)
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	// The process's CPU per row (user and system, every thread): pebble
	// flushes and compacts in goroutines of its own and writes through
	// system calls, and on a shared machine the wall time per row moves
	// with the neighbours more than this does.
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/row")
}

// processCPU is the CPU time this process has used, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
