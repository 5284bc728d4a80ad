package pgsource

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// The session's side of decoding (the core decides, core.go): a message
// is parsed, what the core needs from outside is looked up (a relation's
// description in the catalog, a watermark's chunk, the subscriptions as of
// a BEGIN, the copies given up), the core is stepped, and its actions are
// carried out in order.

// handle applies one pgoutput message.
func (ss *session) handle(ctx context.Context, data []byte) error {
	msg, err := parseMessage(data)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	c := ss.core
	if c.hasCopies() {
		ss.syncCopies()
	}
	switch m := msg.(type) {
	case msgBegin:
		// begun before the subscriptions are taken: Subscribe bumps their
		// version before it reads begun, so a subscription the core does
		// not get replays this transaction.
		s := ss.s
		ts := c.tsOf(m)
		s.begun.Store(max(s.begun.Load(), uint64(ts)))
		err = c.begin(m, ss.changedSubs())
	case msgCommit:
		err = c.commit(m)
	case msgRelation:
		var rel pgcodec.Relation
		if rel, err = ss.describe(ctx, &m); err == nil {
			c.relation(&m, rel)
		}
	case msgInsert:
		err = c.change(m.rel, pgcodec.Insert, nil, 0, m.new)
	case msgUpdate:
		err = c.change(m.rel, pgcodec.Update, m.old, m.oldKind, m.new)
	case msgDelete:
		err = c.change(m.rel, pgcodec.Delete, m.old, m.oldKind, nil)
	case msgTruncate:
		err = c.truncate(m)
	case msgMessage:
		chunk, ready := ss.s.copyChunkOf(m)
		c.message(m, chunk, ready)
	case msgIgnored:
	}
	if err != nil {
		return err
	}
	return ss.carry(ctx)
}

// changedSubs returns the subscriptions by table if they changed since
// the session last took them (nil: unchanged).
func (ss *session) changedSubs() map[uint32][]*sub {
	s := ss.s
	if ss.subsTaken && ss.subsVer == s.subsVersion.Load() {
		return nil // the common case: no lock
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	subs := make(map[uint32][]*sub, len(s.mu.subs))
	for oid, l := range s.mu.subs {
		subs[oid] = append([]*sub(nil), l...)
	}
	ss.subsVer, ss.subsTaken = s.subsVersion.Load(), true
	return subs
}

// syncCopies tells the core what the copier gave up since it last did
// (one atomic load a message while copies are open; the registry's lock
// only when something was given up).
func (ss *session) syncCopies() {
	s := ss.s
	n := s.copyDrops.Load()
	if n == ss.copyDropsSeen {
		return
	}
	ss.copyDropsSeen = n
	s.copies.Lock()
	defer s.copies.Unlock()
	ss.core.forgetCopies(func(c *copyChunk) bool { _, ok := s.copies.m[c.id]; return ok },
		func(st *copyState) bool { return st.abandoned.Load() })
}

// copyChunkOf returns the chunk a copy watermark names, registered (nil:
// another process's, or given up), and whether the copier filled it in.
func (s *Source) copyChunkOf(m msgMessage) (*copyChunk, bool) {
	if m.prefix != copyPrefix {
		return nil, false
	}
	_, id, ok := cutColon(m.content)
	if !ok {
		return nil, false
	}
	s.copies.Lock()
	defer s.copies.Unlock()
	c := s.copies.m[id]
	return c, c != nil && c.ready
}

// cutColon splits "kind:id".
func cutColon(b []byte) (string, string, bool) {
	for i, x := range b {
		if x == ':' {
			return string(b[:i]), string(b[i+1:]), true
		}
	}
	return "", "", false
}

// carry carries the core's actions out, in order, and then publishes what
// it counted.
func (ss *session) carry(ctx context.Context) error {
	s := ss.s
	defer ss.publishTally()
	for _, a := range ss.core.take() {
		switch a.kind {
		case actBegin: // begun was stored before the core began it (handle)
		case actPush:
			if err := ss.push(ctx, a.sub, a.batch); err != nil {
				return err
			}
		case actFrontier:
			if err := s.opts.Schema.AdvanceResolvedTs(a.ts); err != nil && !errors.Is(err, schemastore.ErrResolvedTsRegressed) {
				return fmt.Errorf("pgsource: schema frontier: %w", err)
			}
		case actDDL:
			if err := s.opts.Schema.AddDDL(a.ddl); err != nil && !errors.Is(err, schemastore.ErrDDLBeforeFrontier) && !errors.Is(err, schemastore.ErrDuplicateDDL) {
				return fmt.Errorf("pgsource: record the DDL of table %d: %w", a.ddl.TableID, err)
			}
		case actAnnounce:
			s.announce(a.rel, a.err, a.ts)
		case actFinishCopy:
			s.finishCopy(a.chunk, a.ts, a.retry)
		case actCommitted:
			s.committed.Store(max(s.committed.Load(), uint64(a.ts)))
			s.lastCommit.Store(s.now().UnixNano())
			s.met.committedTs.Set(float64(a.ts.PhysicalMs()) / 1000)
		case actResolve:
			if err := ss.pushResolved(ctx, a.subs, a.ts); err != nil {
				return err
			}
		}
	}
	return nil
}

// publishTally adds what the core counted to the metrics.
func (ss *session) publishTally() {
	t := &ss.core.tally
	if *t == (tally{}) {
		return
	}
	m := ss.s.met
	m.rows.Add(float64(t.rows))
	m.ddls.Add(float64(t.ddls))
	m.commits.Add(float64(t.commits))
	m.heartbeats.Add(float64(t.heartbeats))
	m.copyRows.Add(float64(t.copyRows))
	ss.s.copied.Add(t.copyRows)
	*t = tally{}
}

// pushResolved moves subs' resolved-ts to ts in one eventstore.PushResolvedGuarded
// call (one store event per write worker, not a push per table), telling
// the core of each that moved.
func (ss *session) pushResolved(ctx context.Context, subs []*sub, ts common.Ts) error {
	guards := ss.resolvingGuards[:0]
	for _, b := range subs {
		guards = append(guards, b.guard)
	}
	defer func() {
		clear(guards)
		ss.resolvingGuards = guards[:0]
	}()
	errs := make([]error, len(subs))
	ss.pushContext(ctx)
	eventstore.PushResolvedGuarded(ss.pushCtx, ss.pushCancel, guards, ts, errs)
	for i, b := range subs {
		err := errs[i]
		if err == nil {
			ss.core.resolvedPushed(b, ts)
			continue
		}
		if (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) && ctx.Err() == nil && !b.guard.IsClosed() {
			continue // another subscription's Close cancelled the call: the next round moves this one
		}
		if err := ss.pushed(b, eventstore.Batch{ResolvedTs: ts}, err); err != nil {
			return err
		}
	}
	return nil
}

// describe turns a relation message into a pgcodec.Relation: SQL type
// names from the catalog (cached) and the key from the message's flags,
// or, for REPLICA IDENTITY FULL (every column flagged), the primary key.
func (ss *session) describe(ctx context.Context, m *msgRelation) (pgcodec.Relation, error) {
	rel := pgcodec.Relation{OID: m.oid, Schema: m.namespace, Name: m.name}
	var pk map[string]bool
	if m.replicaIdentity == 'f' {
		cols, err := tableColumns(ctx, ss.catalog, m.oid, 'f')
		if err != nil {
			return rel, err
		}
		pk = map[string]bool{}
		for _, c := range cols {
			if c.Key {
				pk[c.Name] = true
			}
		}
	}
	for _, c := range m.columns {
		col := pgcodec.Column{Name: c.name, TypeOID: c.typeOID}
		if known, ok := ss.core.known(m.oid); ok {
			for _, kc := range known.Columns {
				if kc.Name == c.name && kc.TypeOID == c.typeOID {
					col = kc
				}
			}
		}
		if col.Type == "" {
			_, seen := ss.core.known(m.oid)
			if err := ss.newColumn(ctx, m, c, seen, &col); err != nil {
				return rel, err
			}
		}
		col.Key = c.key
		if pk != nil {
			col.Key = pk[c.name]
		}
		rel.Columns = append(rel.Columns, col)
	}
	shape, captured := ss.core.captured(m.oid)
	if captured {
		// The last DDL capture before this description: its numbers
		// tell a rename from a drop and an add (ddlcapture.go).
		for i := range rel.Columns {
			rel.Columns[i].Num = shape.nums[rel.Columns[i].Name]
		}
		rel.UnknownConversion = shape.unknownConversion
	}
	rel.Identity = identityOf(rel.Columns, m.replicaIdentity)
	known, isKnown := ss.core.known(m.oid)
	switch {
	case captured && len(shape.nums) == len(rel.Columns):
		// The stream never carries generated columns; the capture of the
		// ALTER that changed this version has them (the known version is
		// older: a column added with one reading it, or dropped with it).
		rel.Generated = shape.generated
	case isKnown:
		rel.Generated = known.Generated
	default:
		if err := ss.describeGenerated(ctx, &rel); err != nil {
			return rel, err
		}
	}
	return rel, nil
}

// describeGenerated reads a new table's stored generated columns from the
// catalog (generatedOf), when the stream publishes all its other columns.
func (ss *session) describeGenerated(ctx context.Context, rel *pgcodec.Relation) error {
	gens, err := generatedOf(ctx, ss.catalog, []uint32{rel.OID})
	if err != nil || len(gens[rel.OID]) == 0 {
		return err
	}
	cols, err := tableColumns(ctx, ss.catalog, rel.OID, 'd')
	if err != nil {
		return err
	}
	if len(cols) == len(rel.Columns) {
		rel.Generated = gens[rel.OID]
	}
	return nil
}

// newColumn describes a column this session has not seen (added, when
// the relation was known without it): its SQL type name, the base type of
// a created type, and the value the rows that were there before it hold
// (ADD COLUMN ... DEFAULT: no row change carries it). The catalog is read
// as it is now, not as of the stream's position: the value is the one
// kept since the column was added, until a rewrite of the table (VACUUM
// FULL, a column's type changed) writes it into the rows.
func (ss *session) newColumn(ctx context.Context, m *msgRelation, c relColumn, added bool, col *pgcodec.Column) error {
	if err := ss.catalog.QueryRow(ctx, "SELECT format_type($1, $2)", c.typeOID, c.typeMod).Scan(&col.Type); err != nil {
		return fmt.Errorf("pgsource: type %d of %s.%s: %w", c.typeOID, m.name, c.name, err)
	}
	if c.typeOID >= firstUserOID {
		ref := typeRef{oid: c.typeOID, mod: c.typeMod}
		bases, err := baseTypes(ctx, ss.catalog, []typeRef{ref})
		if err != nil {
			return fmt.Errorf("pgsource: base type of %s.%s: %w", m.name, c.name, err)
		}
		if col.Base = bases[ref]; col.Base == "" {
			col.Base = "text"
		}
	}
	if !added {
		return nil // a table new to the session: every row of it is streamed
	}
	var missing *string
	var hasDefault bool
	err := ss.catalog.QueryRow(ctx, `SELECT CASE WHEN atthasmissing THEN (attmissingval::text::text[])[1] END, atthasdef
FROM pg_attribute WHERE attrelid = $1 AND attname = $2 AND NOT attisdropped`, m.oid, c.name).Scan(&missing, &hasDefault)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return fmt.Errorf("pgsource: the value of %s.%s in earlier rows: %w", m.name, c.name, err)
	case missing != nil:
		col.Missing, col.HasMissing = *missing, true
	case hasDefault:
		// Either the default came after the column (the rows keep their
		// NULLs, as the target's do) or adding it rewrote the table (a
		// volatile default, a domain with a constraint): PostgreSQL then
		// wrote the values into the rows, and logical decoding carries no
		// change for a rewrite. Which one, the catalog does not say.
		ss.s.log.Warn("a column added with a default the rows that were there may hold without any change streamed: if adding it rewrote the table, the target's rows have NULL there (compare tells)",
			zap.String("table", pgcodec.QuoteIdent(m.namespace)+"."+pgcodec.QuoteIdent(m.name)), zap.String("column", c.name))
	}
	return nil
}

// push hands a batch to a subscription's sink. A closed subscription is
// skipped; a store that is closing ends the session.
func (ss *session) push(ctx context.Context, b *sub, batch eventstore.Batch) error {
	ss.pushContext(ctx)
	return ss.pushed(b, batch, b.guard.Push(ss.pushCtx, ss.pushCancel, batch))
}

// pushContext makes sure the session's push context is live. One push
// context for the session, made again only after a subscription's Close
// cancelled it: a context per push would add an allocation and a
// registration in the parent's to every push.
func (ss *session) pushContext(ctx context.Context) {
	if ss.pushCtx == nil || ss.pushCtx.Err() != nil {
		if ss.pushCancel != nil {
			ss.pushCancel()
		}
		ss.pushCtx, ss.pushCancel = context.WithCancel(ctx)
	}
}

// pushed is what a push of batch to b that returned err means for the
// session: nil to go on, or the error that ends it.
func (ss *session) pushed(b *sub, batch eventstore.Batch, err error) error {
	switch {
	case err == nil, errors.Is(err, eventstore.ErrSubscriptionClosed):
		return nil
	case errors.Is(err, eventstore.ErrRowBeforeResolved), errors.Is(err, eventstore.ErrResolvedTsRegressed):
		// A session that reads commits again skips what each subscription
		// has (flush), so the store refusing a push means the two disagree
		// on what was delivered: a row it refused may never reach the
		// dispatchers. Ending the stream would read the same commits into
		// the same refusal, so it goes on, loudly: an error and a counter
		// to alert on, never a debug line.
		ss.s.met.refused.Inc()
		ss.s.log.Error("the store refused a push: rows of this table may be missing downstream",
			zap.Uint32("table", b.oid), zap.Int("rows", len(batch.Rows)), zap.Uint64("resolvedTs", uint64(batch.ResolvedTs)), zap.Error(err))
		return nil
	}
	return fmt.Errorf("pgsource: push to table %d: %w", b.oid, err)
}

// endPushes releases the push context.
func (ss *session) endPushes() {
	if ss.pushCancel != nil {
		ss.pushCancel()
	}
}
