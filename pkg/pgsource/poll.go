package pgsource

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// runPublicationPoll lists the publication's tables every
// PublicationPollInterval and announces those that joined it (ALTER
// PUBLICATION ... ADD TABLE, CREATE TABLE under FOR ALL TABLES) and that
// the stream has not announced at a first change: a table added with
// rows and no change since must be found to be copied. Its cost is one
// catalog query a round, and the tables' descriptions only when one
// joined.
func (s *Source) runPublicationPoll() {
	t := s.opts.Clock.NewTicker(s.opts.PublicationPollInterval)
	defer t.Stop()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C():
		}
		s.mu.Lock()
		ready := s.mu.snapshotDone
		s.mu.Unlock()
		if !ready {
			continue // the snapshot copies what is published now
		}
		if conn == nil {
			c, err := connect(s.ctx, s.opts.DSN)
			if err != nil {
				s.log.Debug("publication poll: connect", zap.Error(err))
				continue
			}
			conn = c
		}
		ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
		err := s.pollPublication(ctx, conn)
		cancel()
		if err != nil && s.ctx.Err() == nil {
			s.log.Warn("publication poll", zap.Error(err))
			conn.Close(context.Background())
			conn = nil
		}
	}
}

// pollPublication announces the published tables not known to be.
func (s *Source) pollPublication(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, `
SELECT c.oid FROM pg_publication_tables pt
JOIN pg_namespace n ON n.nspname = pt.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
WHERE pt.pubname = $1`, s.opts.Publication)
	if err != nil {
		return err
	}
	var joined bool
	s.mu.Lock()
	for rows.Next() {
		var oid uint32
		if err := rows.Scan(&oid); err != nil {
			break
		}
		if !s.mu.published[oid] {
			joined = true
		}
	}
	s.mu.Unlock()
	rows.Close()
	if err := rows.Err(); err != nil || !joined {
		return err
	}
	tables, err := publishedTables(ctx, conn, s.opts.Publication)
	if err != nil {
		return err
	}
	for _, t := range tables {
		s.announce(t.relation(), t.relationErr, 0)
	}
	return nil
}

// announce reports a table that joined the publication, once: from the
// stream (firstTs its first change's commit-ts) or from the poll
// (firstTs 0: after the last commit decoded). One that cannot be
// replicated (relErr, no key) is logged and counted instead.
func (s *Source) announce(rel pgcodec.Relation, relErr error, firstTs common.Ts) {
	s.mu.Lock()
	if s.mu.published[rel.OID] && firstTs == 0 {
		s.mu.Unlock()
		return
	}
	s.mu.published[rel.OID] = true
	ts := s.mu.committed + 1
	if firstTs != 0 {
		ts = firstTs
	}
	if _, held := s.mu.holds[rel.OID]; !held && relErr == nil && len(s.mu.subs[rel.OID]) == 0 {
		// A table subscribed meanwhile is not held again: the stream's
		// list of subscriptions is the one of its transaction's BEGIN,
		// and nothing would take a hold set now off.
		s.mu.holds[rel.OID] = ts
	}
	s.mu.Unlock()
	if relErr != nil {
		s.met.skippedTables.Inc()
		s.log.Error("changes of a table that cannot be replicated are skipped (no key)", zap.Uint32("oid", rel.OID),
			zap.String("table", rel.QualifiedName()), zap.Error(relErr))
		return
	}
	s.met.joined.Inc()
	s.log.Info("a table joined the publication: holding the slot before it until it is subscribed",
		zap.String("table", rel.QualifiedName()), zap.Stringer("from", ts))
	if f := s.opts.OnNewTable; f != nil {
		f(rel, ts)
	}
}
