package pgsource

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// The publication's poll (runPublicationPoll, on the side connection):
// tables that joined the publication without a change since are found and
// announced, tables that left are marked, and tables that left and joined
// again are told (OnRejoin), so that their changes while out are copied
// anew. Invariants: a table is announced once, at the stream's first change
// or the poll's round, whichever comes first, and the slot is held before
// it until it is subscribed (announce); a publication the changefeed
// manages has its list brought to its rule before the round reads it
// (publication.go); the poll's view of the publication is Source.pub's.

// runPublicationPoll lists the publication's tables every
// PublicationPollInterval and announces those that joined it (ALTER
// PUBLICATION ... ADD TABLE, CREATE TABLE under FOR ALL TABLES) and that
// the stream has not announced at a first change: a table added with
// rows and no change since must be found to be copied. Its cost is one
// catalog query a round, and the tables' descriptions only when one
// joined.
func (s *Source) runPublicationPoll() {
	s.everyTick(s.opts.PublicationPollInterval, time.Minute, "publication poll", zap.WarnLevel, func(ctx context.Context, conn *pgx.Conn) error {
		s.mu.Lock()
		ready := s.mu.snapshotDone
		s.mu.Unlock()
		if !ready {
			return nil // the snapshot copies what is published now
		}
		if s.opts.ManagePublication {
			// The list first: a table it adds is found joined below, in
			// the same round.
			if _, err := s.syncPublication(ctx, conn); err != nil {
				return err
			}
		}
		return s.pollPublication(ctx, conn)
	})
}

// pollPublication announces the published tables not known to be, and
// tells of those that left the publication and joined it again
// (OnRejoin): absent from one round and back in a later one, or back under
// a new membership row (pg_publication_rel) between two rounds.
func (s *Source) pollPublication(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, `
SELECT c.oid, coalesce(pr.oid, 0) FROM pg_publication_tables pt
JOIN pg_namespace n ON n.nspname = pt.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
LEFT JOIN pg_publication_rel pr ON pr.prrelid = c.oid AND pr.prpubid IN (SELECT oid FROM pg_publication WHERE pubname = ANY($1))
WHERE pt.pubname = ANY($1) AND pt.schemaname <> '`+ToolSchema+`'`, s.pubs)
	if err != nil {
		return err
	}
	type member struct{ oid, row uint32 }
	var now []member
	for rows.Next() {
		var m member
		if err := rows.Scan(&m.oid, &m.row); err != nil {
			rows.Close()
			return err
		}
		now = append(now, m)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	var joined bool
	rejoined := map[uint32]bool{}
	current := make(map[uint32]bool, len(now))
	s.pub.Lock()
	for _, m := range now {
		current[m.oid] = true
		switch before := s.pub.membership[m.oid]; {
		case s.pub.left[m.oid]:
			rejoined[m.oid] = true
		case !s.pub.published[m.oid]:
			joined = true
		case m.row != 0 && before != 0 && m.row != before:
			rejoined[m.oid] = true // removed and added again between two rounds
		}
		s.pub.membership[m.oid] = m.row
	}
	var left []uint32
	for oid, p := range s.pub.published {
		if p && !current[oid] {
			s.pub.published[oid], s.pub.left[oid] = false, true
			delete(s.pub.membership, oid)
			left = append(left, oid)
		}
	}
	s.pub.Unlock()
	for _, oid := range left {
		s.log.Warn("a table left the publication: its changes are not streamed until it joins again (then it is copied anew)",
			zap.Uint32("oid", oid))
	}
	if !joined && len(rejoined) == 0 {
		return nil
	}
	tables, err := publishedTables(ctx, conn, s.pubs)
	if err != nil {
		return err
	}
	for _, t := range tables {
		if rejoined[t.oid] {
			s.rejoin(t.relation(), t.relationErr)
		} else {
			s.announce(t.relation(), t.relationErr, 0)
		}
	}
	return nil
}

// seedMembership records the membership rows as Open finds them, so that
// the poll's first round tells of a table removed and added again since
// (found by review: the first round took every row for the first seen).
func (s *Source) seedMembership(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, `
SELECT prrelid, oid FROM pg_publication_rel WHERE prpubid IN (SELECT oid FROM pg_publication WHERE pubname = ANY($1))`, s.pubs)
	if err != nil {
		return fmt.Errorf("%w: membership: %w", ErrConnect, err)
	}
	seen := map[uint32]uint32{}
	for rows.Next() {
		var table, row uint32
		if err := rows.Scan(&table, &row); err != nil {
			rows.Close()
			return err
		}
		seen[table] = row
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	s.pub.Lock()
	defer s.pub.Unlock()
	for table, row := range seen {
		if _, ok := s.pub.membership[table]; !ok {
			s.pub.membership[table] = row
		}
	}
	return nil
}

// rejoin reports a table that left the publication and joined it again:
// its changes while it was out are not in the stream. One subscribed is
// told to OnRejoin (serve copies it anew, emptied first), one that is not
// is announced as a table that joined.
func (s *Source) rejoin(rel pgcodec.Relation, relErr error) {
	s.mu.Lock()
	subscribed := len(s.mu.subs[rel.OID]) > 0
	s.mu.Unlock()
	s.pub.Lock()
	delete(s.pub.left, rel.OID)
	if subscribed {
		s.pub.published[rel.OID] = true
	}
	s.pub.Unlock()
	if !subscribed {
		s.announce(rel, relErr, 0)
		return
	}
	if relErr != nil {
		s.met.skippedTables.Inc()
		s.log.Error("a table joined the publication again without a key: its changes cannot be replicated", zap.String("table", rel.QualifiedName()),
			zap.Error(relErr))
		return
	}
	s.met.joined.Inc()
	s.log.Warn("a table joined the publication again: its changes while it was out were not streamed, so it is copied anew",
		zap.String("table", rel.QualifiedName()))
	if f := s.opts.OnRejoin; f != nil {
		f(rel)
	}
}

// announce reports a table that joined the publication, once: from the
// stream (firstTs its first change's commit-ts) or from the poll
// (firstTs 0: after the last commit decoded). One that cannot be
// replicated (relErr, no key) is logged and counted instead.
func (s *Source) announce(rel pgcodec.Relation, relErr error, firstTs common.Ts) {
	s.pub.Lock()
	if s.pub.published[rel.OID] && (firstTs == 0 || relErr != nil) {
		// Known already: a new table's first change announced it, or it
		// was left out (no key) at Open, and said so there.
		s.pub.Unlock()
		return
	}
	s.pub.published[rel.OID] = true
	s.pub.Unlock()
	s.mu.Lock()
	ts := common.Ts(s.committed.Load()) + 1
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

// Membership is the publication's identity and the membership row
// (pg_publication_rel's oid) of each table it names one by one, by table
// OID: a partition published through a partitioned table it belongs to
// has the row of the nearest such table, as the stream sends its own
// changes. A table removed from the publication and added again gets a
// new row, so an embedder that records the rows can tell, after a time it
// was not running, that a table's changes while it was out were never
// streamed (serve copies such a table anew). Tables published through
// FOR ALL TABLES or FOR TABLES IN SCHEMA have no row and are absent.
type Membership struct {
	// Publication is the publication's oid (0: it does not exist): a
	// publication dropped and created again under the same name has
	// another, and every row with it.
	Publication uint32
	Rows        map[uint32]uint32
}

// Memberships reads the publication's Membership.
func (s *Source) Memberships(ctx context.Context) (Membership, error) {
	conn, err := connect(ctx, s.opts.DSN)
	if err != nil {
		return Membership{}, err
	}
	defer conn.Close(context.Background())
	m := Membership{Rows: map[uint32]uint32{}}
	err = conn.QueryRow(ctx, "SELECT coalesce((SELECT oid FROM pg_publication WHERE pubname = $1), 0)", s.opts.Publication).Scan(&m.Publication)
	if err != nil {
		return Membership{}, fmt.Errorf("%w: memberships: %w", ErrConnect, err)
	}
	// pg_partition_tree lists a partitioned table's or a partition's tree
	// (the leaves at their depth below it) and nothing for a plain table.
	rows, err := conn.Query(ctx, `
SELECT DISTINCT ON (leaf) leaf, row FROM (
  SELECT coalesce(t.relid, pr.prrelid)::oid AS leaf, pr.oid AS row, coalesce(t.level, 0) AS depth
  FROM pg_publication_rel pr
  LEFT JOIN LATERAL pg_partition_tree(pr.prrelid) t ON t.isleaf
  WHERE pr.prpubid = $1) m
ORDER BY leaf, depth`, m.Publication)
	if err != nil {
		return Membership{}, fmt.Errorf("%w: memberships: %w", ErrConnect, err)
	}
	for rows.Next() {
		var table, row uint32
		if err := rows.Scan(&table, &row); err != nil {
			rows.Close()
			return Membership{}, err
		}
		m.Rows[table] = row
	}
	rows.Close()
	return m, rows.Err()
}
