package eventservice

import (
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// scanOutcome is how a scan task ended.
type scanOutcome uint8

const (
	scanDone        scanOutcome = iota // reached the end of its range
	scanInterrupted                    // stopped at a limit; more to read
	scanBlocked                        // reached the schema frontier, data waits above it
	scanFailed                         // transport refused or failed, or the store erred
	scanNoRoom                         // not read: the target had no room; waits for it
)

var scanOutcomeNames = [...]string{"done", "interrupted", "blocked", "failed", "no_room"}

// runScanWorker executes scan tasks from the scan channel.
func (svc *Service) runScanWorker() {
	w := &ownerWork{sc: newScanner(svc)}
	for {
		select {
		case s := <-svc.scanCh:
			svc.scanOne(w, s)
		case <-svc.closing:
			return
		}
	}
}

// scanOne runs the scan of s, just taken from the scan channel (one
// iteration of a scan worker).
func (svc *Service) scanOne(w *ownerWork, s *session) {
	svc.scanPending.Add(-1)
	if act, _ := s.sched.fire(evPopScan); act != actOwn {
		return // removed while queued
	}
	svc.knobs.reach(pointBeforeScan, s, nil)
	if room := s.d.target.room; room != nil && !room.hasRoom(s.d.target.name) {
		// A read now would most likely be refused at the send and thrown
		// away; the session waits for room as a refused one does, and
		// reads then.
		svc.run(w, s, input{kind: inScanRead, read: scanRead{noRoom: true}})
		return
	}
	sw := clock.StartStopwatch() // the task: its read and its send
	svc.run(w, s, input{kind: inScanRead, read: w.sc.read(s)})
	svc.metrics.scanDuration.Observe(sw.Elapsed().Seconds())
}

// scanner is a scan worker's reusable state.
type scanner struct {
	svc   *Service
	ddls  []schemastore.DDL
	msgs  []messaging.Message
	arena rowArena
	// slab holds the rows of the batches being built: a batch's Rows is a
	// full-capacity sub-slice of it, so a one-row message costs one row,
	// not room for BatchRows, and rows are written once. batchStart is
	// where the current batch begins.
	slab       []common.Row
	batchStart int
	// slabGen counts slab replacements, so a task can tell whether the
	// slab it started in is still the current one.
	slabGen int
}

func newScanner(svc *Service) *scanner { return &scanner{svc: svc} }

// read reads (resolved, min(received, schema frontier)] of s's span after
// its cursor, merges the table's DDLs by commit-ts (a DDL after the DML of
// its commit-ts), and stops at a transaction boundary once a task limit is
// reached (or inside a transaction larger than LargeTxnSplitBytes, at a
// row). The messages wait in sc.msgs for the step to send them in one
// all-or-nothing transport call (fxSendScan); the progress they reach is
// published only once they are accepted. REQUIRES: s owned.
func (sc *scanner) read(s *session) scanRead {
	svc, d, p := sc.svc, s.d, s.own.progress
	received := common.Ts(d.received.Load())
	schemaTs := svc.opts.Schema.ResolvedTs()
	end := min(received, schemaTs)
	if p.cursor != nil {
		end = max(end, p.cursor.CommitTs) // never below a resume point
	}
	if end <= p.resolved && p.cursor == nil {
		return scanRead{nothing: true, received: received, schemaTs: schemaTs}
	}
	var err error
	sc.ddls, err = svc.opts.Schema.FetchDDLs(d.span.Table(), p.resolved, end, sc.ddls[:0])
	if err != nil {
		svc.log.Warn("fetch DDLs failed; retrying later", zap.Stringer("dispatcher", d.id), zap.Error(err))
		return scanRead{failed: true}
	}
	trimmed := false
	if limit := svc.maxDDLsPerTask(); len(sc.ddls) > limit {
		// Too many DDLs for one task: end just below the first DDL that
		// does not fit. It lies above any cursor (DDLs are at distinct
		// commit-ts, the first at or above the cursor's), so the range
		// stays valid, and the rest is read by the follow-up task.
		end = sc.ddls[limit].CommitTs - 1
		sc.ddls = sc.ddls[:limit]
		trimmed = true
	}
	it, err := svc.opts.Store.NewIterator(d.id, eventstore.ScanRange{Start: p.resolved, End: end, After: p.cursor})
	if err != nil {
		svc.log.Warn("open iterator failed; retrying later", zap.Stringer("dispatcher", d.id), zap.Error(err))
		return scanRead{failed: true}
	}
	b := sc.newBuild(s, end)
	next, err := b.run(it)
	if cerr := it.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		sc.reset() // never let a failed task's messages leak into the next
		svc.log.Warn("scan failed; retrying later", zap.Stringer("dispatcher", d.id), zap.Error(err))
		return scanRead{failed: true}
	}
	svc.metrics.scannedRows.Add(float64(b.rows))
	svc.metrics.scannedBytes.Add(float64(b.bytes))
	svc.scannedRows.Add(uint64(b.rows))
	svc.scannedBytes.Add(uint64(b.bytes))
	sc.compactSmallTask(b)
	return scanRead{msgs: len(sc.msgs), next: next, cut: b.interrupted || trimmed, received: received, schemaTs: schemaTs}
}

// reset drops the task's messages (the transport owns accepted ones) and
// any half-built batch.
func (sc *scanner) reset() {
	sc.batchStart = len(sc.slab)
	clear(sc.msgs)
	sc.msgs = sc.msgs[:0]
}

func (sc *scanner) header(s *session, seq uint64) messaging.Header {
	return messaging.Header{Dispatcher: s.d.id, Registration: s.d.reg, Epoch: s.epoch, Seq: seq}
}

// build accumulates the messages of one scan task.
type build struct {
	sc          *scanner
	s           *session
	end         common.Ts
	next        progress
	batchRows   int
	ddl         int // index of the next DDL to emit
	rows, bytes int
	interrupted bool
	mark        rowMemMark // where the task's rows start in the slab and arena
}

func (sc *scanner) newBuild(s *session, end common.Ts) *build {
	return &build{sc: sc, s: s, end: end, next: s.own.progress, mark: sc.markRowMem()}
}

// run consumes the iterator and returns the progress the messages reach.
func (b *build) run(it eventstore.RowIterator) (progress, error) {
	o := &b.sc.svc.opts
	var lastCommit, lastStart common.Ts
	var lastKey []byte
	var txnBytes int
	first := true
	for it.Next() {
		r := it.Row()
		if it.NewTxn() {
			if !first && (b.bytes >= o.ScanLimitBytes || b.rows >= o.ScanLimitRows || b.full()) {
				b.interruptAtTxn(lastCommit, lastStart, r.CommitTs)
				return b.next, nil
			}
			if first || r.CommitTs > lastCommit {
				// DDLs strictly before this commit-ts go first; those at it
				// wait until its DML is out.
				b.emitDDLsBefore(r.CommitTs)
			}
			if b.batchRows >= o.BatchRows {
				b.closeBatch(false)
			}
			txnBytes = 0
		} else if txnBytes >= o.LargeTxnSplitBytes && b.bytes >= o.ScanLimitBytes {
			b.splitAt(lastCommit, lastStart, lastKey)
			return b.next, nil
		}
		first = false
		row := b.sc.arena.copyRow(r)
		b.addRow(row)
		size := r.Size()
		txnBytes += size
		b.bytes += size
		b.rows++
		lastCommit, lastStart, lastKey = row.CommitTs, row.StartTs, row.Key
	}
	if err := it.Err(); err != nil {
		return progress{}, err
	}
	b.closeBatch(false)
	// Every row up to end is out; DDLs up to end follow.
	b.emitDDLsUpTo(b.end)
	b.next.resolved, b.next.cursor = b.end, nil
	return b.next, nil
}

// full reports whether the task reached its message cap at a transaction
// boundary, leaving room for the closing batch and the resolved-ts. DDLs
// are bounded separately (maxDDLsPerTask), so a task sends at most
// MaxMessagesPerTask + 2*maxDDLsPerTask messages.
func (b *build) full() bool { return len(b.sc.msgs) >= b.sc.svc.opts.MaxMessagesPerTask-3 }

// closeBatch ends the current DMLBatch, assigning it the next seq.
func (b *build) closeBatch(partial bool) {
	if b.batchRows == 0 {
		return
	}
	sc := b.sc
	end := len(sc.slab)
	rows := sc.slab[sc.batchStart:end:end]
	sc.batchStart = end
	b.next.seq++
	sc.msgs = append(sc.msgs, &messaging.DMLBatch{Header: sc.header(b.s, b.next.seq), Rows: rows, Partial: partial})
	b.batchRows = 0
}

// interruptAtTxn stops before a transaction, after (lastCommit, lastStart).
func (b *build) interruptAtTxn(lastCommit, lastStart, nextCommit common.Ts) {
	b.closeBatch(false)
	b.interrupted = true
	if nextCommit > lastCommit {
		// A commit-ts boundary: its DDLs may follow, then it is resolved.
		b.emitDDLsUpTo(lastCommit)
		b.next.resolved, b.next.cursor = lastCommit, nil
		return
	}
	// Inside a commit-ts shared by several transactions: resolved stays
	// below it and the cursor names the last whole transaction.
	b.next.resolved = max(b.next.resolved, lastCommit-1)
	b.next.cursor = &eventstore.Cursor{CommitTs: lastCommit, StartTs: lastStart}
}

// splitAt stops inside a large transaction, after the row lastKey.
func (b *build) splitAt(lastCommit, lastStart common.Ts, lastKey []byte) {
	b.closeBatch(true)
	b.interrupted = true
	b.next.resolved = max(b.next.resolved, lastCommit-1)
	b.next.cursor = &eventstore.Cursor{CommitTs: lastCommit, StartTs: lastStart, Key: append([]byte(nil), lastKey...)}
}

// emitDDLsBefore emits the DDLs with commit-ts < ts.
func (b *build) emitDDLsBefore(ts common.Ts) { b.emitDDLs(ts - 1) }

// emitDDLsUpTo emits the DDLs with commit-ts <= ts.
func (b *build) emitDDLsUpTo(ts common.Ts) { b.emitDDLs(ts) }

func (b *build) emitDDLs(upTo common.Ts) {
	ddls := b.sc.ddls
	for b.ddl < len(ddls) && ddls[b.ddl].CommitTs <= upTo {
		b.closeBatch(false)
		dl := ddls[b.ddl]
		b.next.seq++
		b.sc.msgs = append(b.sc.msgs, &messaging.DDL{Header: b.sc.header(b.s, b.next.seq),
			TableID: dl.TableID, CommitTs: dl.CommitTs, Query: dl.Query})
		b.ddl++
	}
}

// maxDDLsPerTask bounds the DDLs one task emits.
func (svc *Service) maxDDLsPerTask() int { return max(1, svc.opts.MaxMessagesPerTask/4) }
