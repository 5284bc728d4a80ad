package pgsource

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// The initial snapshot, for a slot Open created: every subscribed table is
// read in the slot's exported snapshot by SnapshotWorkers connections, its
// rows pushed at the snapshot's commit-ts in chunks of ChunkRows, then each
// subscription resolved to that ts; the stream starts from the slot's
// consistent point only after, on the slot's own connection. Invariants:
// every row of the snapshot carries its ts and no subscription is resolved
// to it before all its rows are pushed; the exported snapshot's connection
// runs nothing until the copy is done (another command would end the
// snapshot); a failure stops the source, since a snapshot cannot be
// resumed (serve starts over).

// snapshotProgress counts the initial snapshot's work.
type snapshotProgress struct {
	running            atomic.Bool
	tables, tablesDone atomic.Int64
	rows, estimate     atomic.Int64
	started            atomic.Int64 // clock UnixNano
}

// SnapshotProgress is how far the initial snapshot is.
type SnapshotProgress struct {
	Running    bool
	Tables     int64
	TablesDone int64
	Rows       int64
	// EstimatedRows is the catalog's estimate of all the tables' rows.
	EstimatedRows int64
	Elapsed       time.Duration
}

// Snapshot returns the initial snapshot's progress (zero if the slot
// existed already).
func (s *Source) Snapshot() SnapshotProgress {
	p := &s.progress
	out := SnapshotProgress{Running: p.running.Load(), Tables: p.tables.Load(), TablesDone: p.tablesDone.Load(),
		Rows: p.rows.Load(), EstimatedRows: p.estimate.Load()}
	if st := p.started.Load(); st != 0 {
		out.Elapsed = time.Duration(s.now().UnixNano() - st)
	}
	return out
}

// copySnapshot copies every subscribed table as of the slot's exported
// snapshot, at commit-ts SnapshotTs, with SnapshotWorkers connections that
// share the snapshot; the slot's own connection stays idle meanwhile (the
// snapshot lives until it runs another command). Each table's rows are
// pushed in chunks, then its subscriptions' resolved-ts moves to the
// snapshot.
func (s *Source) copySnapshot() error {
	snap := s.snapshot
	var todo []catalogTable
	for _, t := range s.tables {
		if len(s.subsFor(t.oid)) > 0 {
			todo = append(todo, t)
			s.progress.estimate.Add(int64(t.reltuples))
		}
	}
	s.progress.tables.Store(int64(len(todo)))
	s.progress.started.Store(s.now().UnixNano())
	s.progress.running.Store(true)
	defer s.progress.running.Store(false)
	s.log.Info("initial snapshot", zap.Int("tables", len(todo)), zap.Stringer("ts", snap.ts))
	work := make(chan catalogTable)
	errs := make(chan error, s.opts.SnapshotWorkers)
	var wg sync.WaitGroup
	for range s.opts.SnapshotWorkers {
		wg.Go(func() { errs <- s.snapshotWorker(snap, work) })
	}
	var err error
feed:
	for _, t := range todo {
		select {
		case work <- t:
		case err = <-errs:
			break feed
		case <-s.ctx.Done():
			err = s.ctx.Err()
			break feed
		}
	}
	close(work)
	wg.Wait()
	close(errs)
	for e := range errs {
		err = errors.Join(err, e)
	}
	if err != nil {
		return err
	}
	if err := s.opts.Schema.AdvanceResolvedTs(snap.ts); err != nil && !errors.Is(err, schemastore.ErrResolvedTsRegressed) {
		return err
	}
	s.mu.Lock()
	s.mu.snapshotDone = true
	s.mu.Unlock()
	s.log.Info("initial snapshot done", zap.Int64("rows", s.progress.rows.Load()))
	return nil
}

// snapshotWorker copies the tables it is given in one transaction on the
// exported snapshot.
func (s *Source) snapshotWorker(snap *pendingSnapshot, work <-chan catalogTable) error {
	ctx := s.ctx
	conn, err := connect(ctx, s.opts.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // read only
	if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+pgcodec.QuoteLiteral(snap.name)); err != nil {
		return fmt.Errorf("set the exported snapshot: %w", err)
	}
	for t := range work {
		if err := s.copyTable(ctx, tx, snap.ts, t); err != nil {
			return fmt.Errorf("copy %s.%s: %w", t.schema, t.name, err)
		}
		s.progress.tablesDone.Add(1)
		s.met.snapshotDone.Inc()
	}
	return nil
}

// copyTable reads every row of t (its columns as text) and pushes them as
// inserts at ts, in chunks, to t's subscriptions from below ts.
func (s *Source) copyTable(ctx context.Context, tx pgx.Tx, ts common.Ts, t catalogTable) error {
	rel := t.relation()
	cols := make([]string, len(rel.Columns))
	// In text, by the columns' output functions as pgoutput prints them
	// (see readChunk): a key the snapshot and the stream print alike.
	q := "SELECT " + selectList(rel) + " FROM " + t.only() + rel.QualifiedName() + " t"
	if t.pub.rowFilter != "" {
		q += " WHERE " + t.pub.rowFilter // the publication's row filter: its rows only
	}
	rows, err := tx.Query(ctx, q, pgx.QueryResultFormats{pgx.TextFormatCode})
	if err != nil {
		return err
	}
	defer rows.Close()
	var subs []*sub
	for _, b := range s.subsFor(t.oid) {
		if b.startTs < ts {
			subs = append(subs, b)
		}
	}
	var chunk []common.Row
	var index uint32
	push := func(resolved common.Ts) error {
		for _, b := range subs {
			if err := s.pushSnapshot(ctx, b, eventstore.Batch{Rows: chunk, ResolvedTs: resolved}); err != nil {
				return err
			}
		}
		chunk = nil
		return nil
	}
	for rows.Next() {
		// The raw text, never Scan: pgx scans a json value of JSON null
		// into a nil pointer, which would be SQL NULL.
		vals := rows.RawValues()
		if len(vals) != len(cols) {
			return fmt.Errorf("%w: a snapshot row of %d columns, not %d", ErrProtocol, len(vals), len(cols))
		}
		index++
		datums := make([]pgcodec.Datum, len(cols))
		var key [][]byte
		for i, c := range rel.Columns {
			datums[i].Name = c.Name
			if vals[i] == nil {
				datums[i].Kind = pgcodec.Null
			} else {
				datums[i].Kind, datums[i].Text = pgcodec.Text, slices.Clone(vals[i])
			}
			if c.Key {
				key = append(key, datums[i].Text)
			}
		}
		chunk = append(chunk, common.Row{Op: common.OpPut, Key: pgcodec.AppendKey(nil, index, key),
			Value: pgcodec.AppendValue(nil, pgcodec.RowChange{Change: pgcodec.Insert, Columns: datums}), StartTs: ts - 1, CommitTs: ts})
		s.progress.rows.Add(1)
		s.met.snapshotRows.Inc()
		if len(chunk) >= s.opts.ChunkRows {
			if err := push(0); err != nil {
				return err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if err := push(ts); err != nil {
		return err
	}
	for _, b := range subs {
		b.have, b.resolved = ts, ts
	}
	return nil
}

// pushSnapshot pushes a batch of the snapshot (the snapshot's goroutines
// own the subscriptions until the stream starts).
func (s *Source) pushSnapshot(ctx context.Context, b *sub, batch eventstore.Batch) error {
	ss := &session{s: s}
	defer ss.endPushes()
	return ss.push(ctx, b, batch)
}
