package pgsink

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// Binding dispatchers to their target tables (created when missing) and lanes.

// Binding is a dispatcher's table and where it resumes.
type Binding struct {
	ID  common.DispatcherID
	Rel pgcodec.Relation
	// StartTs is the dispatcher's durable checkpoint until the sink
	// persists a later one.
	StartTs common.Ts
}

// Bind maps dispatcher id to rel's target table (created when missing),
// resuming from startTs.
func (s *Sink) Bind(ctx context.Context, id common.DispatcherID, rel pgcodec.Relation, startTs common.Ts) error {
	return s.BindAll(ctx, []Binding{{ID: id, Rel: rel, StartTs: startTs}})
}

// BindAll binds many dispatchers at once: the missing tables are created
// in one round trip and one transaction, and every table's columns are
// read in one query (a thousand tables must not take a thousand commits).
// A target table that exists but does not match its relation stops that
// table.
func (s *Sink) BindAll(ctx context.Context, bs []Binding) error {
	s.mu.Lock()
	started := s.mu.started
	s.mu.Unlock()
	if !started {
		return fmt.Errorf("%w: Bind before Start", ErrInvalidOptions)
	}
	var fresh []pgcodec.Relation
	for _, b := range bs {
		if err := b.Rel.Validate(); err != nil {
			return err
		}
		if !s.laneFor(b.Rel.OID).has(b.Rel.OID) {
			fresh = append(fresh, b.Rel)
		}
	}
	conn, release, err := s.adminConn(ctx)
	if err != nil {
		return err
	}
	defer release()
	has, err := createdTypes(ctx, conn, fresh...)
	if err != nil {
		return fmt.Errorf("%w: read types: %w", ErrApply, err)
	}
	// A restart binds tables the target has: only those it lacks are
	// created, so a restart's start-up does not pay a statement per table.
	missing, err := missingTables(ctx, conn, fresh)
	if err != nil {
		return fmt.Errorf("%w: read tables: %w", ErrApply, err)
	}
	var creates []string
	for _, r := range fresh {
		if missing[r.QualifiedName()] {
			creates = append(creates, createTableSQL(r, has))
		}
	}
	tables := map[uint32]*table{}
	if len(creates) > 0 {
		if _, err := conn.Exec(ctx, "BEGIN; "+strings.Join(creates, "; ")+"; COMMIT"); err != nil {
			return fmt.Errorf("%w: create tables: %w", ErrApply, err)
		}
	}
	if len(fresh) > 0 {
		if tables, err = loadTables(ctx, conn, fresh); err != nil {
			return fmt.Errorf("%w: read tables: %w", ErrApply, err)
		}
		s.logBaseTypes(tables)
	}
	taken, written, err := s.claimTargets(ctx, conn, bs)
	if err != nil {
		return err
	}
	owning, err := s.ownColumns(ctx, conn, tables, written)
	if err != nil {
		return err
	}
	kept, err := s.loadWritten(ctx, conn, bs)
	if err != nil {
		return err
	}
	first := map[common.DispatcherID]pgcodec.Relation{}
	warm := map[*lane][]*table{}
	for _, b := range bs {
		_, stopped := taken[b.ID]
		if o, ok := taken[b.ID]; ok {
			s.failed(b.ID, fmt.Errorf("%w: %s holds the rows of source table %d, not of %d (dropped and created again, or "+
				"renamed away, while this process ran): a restart empties it for this table once that one has left the changefeed",
				ErrTargetTaken, b.Rel.QualifiedName(), o.oid, b.Rel.OID), true)
		}
		l := s.laneFor(b.Rel.OID)
		if t := tables[b.Rel.OID]; t != nil {
			rel, written := kept[b.ID]
			if !written {
				first[b.ID] = b.Rel
			}
			switch err := owning[b.Rel.OID]; {
			case err != nil:
				s.failed(b.ID, err, true)
				stopped = true
			case written:
				// The kept version is the table's; the stream carries what
				// the catalog's is past it (written.go).
				t.rel = rel
			default:
				if _, err := t.evolve(b.Rel, has); err != nil {
					s.failed(b.ID, err, true) // an existing target table that does not match
					stopped = true
				}
			}
			if t = l.attach(b.ID, t); !stopped && !b.Rel.Keyless() { // a keyless table has no upsert to warm
				warm[l] = append(warm[l], t)
			}
		} else if !l.has(b.Rel.OID) {
			return fmt.Errorf("%w: table %s was not created", ErrApply, b.Rel.QualifiedName())
		} else {
			l.attach(b.ID, &table{rel: b.Rel})
		}
		s.mu.Lock()
		s.mu.bound[b.ID] = &binding{rel: b.Rel, lane: l}
		if s.mu.durable[b.ID] < b.StartTs {
			s.mu.durable[b.ID] = b.StartTs
		}
		s.mu.Unlock()
	}
	if err := s.loadApplied(ctx, conn, bs); err != nil {
		return err
	}
	if err := s.saveWritten(ctx, conn, first); err != nil {
		return err
	}
	for l, ts := range warm {
		l.queueWarm(ts) // while the stream has sent nothing yet (warm.go)
	}
	return nil
}

// logBaseTypes says which columns of tables, as the target has them, are
// of a created type's base type rather than the type itself: a table this
// sink created (one the user created first keeps the types it has).
func (s *Sink) logBaseTypes(tables map[uint32]*table) {
	for _, t := range tables {
		for _, c := range t.rel.Columns {
			if c.Base != "" && t.types[c.Name] == c.Base && c.Base != c.Type {
				s.log.Info("column of a created type stored as its base type", zap.String("table", t.qname),
					zap.String("column", c.Name), zap.String("source_type", c.Type), zap.String("target_type", c.Base))
			}
		}
	}
}

// laneFor is the lane of table oid.
func (s *Sink) laneFor(oid uint32) *lane {
	h := fnv.New32a()
	fmt.Fprint(h, oid)
	return s.lanes[int(h.Sum32()%uint32(len(s.lanes)))]
}

// Unbind forgets a dispatcher (its table removed from the changefeed).
func (s *Sink) Unbind(id common.DispatcherID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mu.bound, id)
	delete(s.mu.durable, id)
}

// SetLeft tells the sink which source tables (by OID) have left the
// changefeed: a target table written only by such tables is emptied when
// a table of its name is bound. Without it such a table stops instead
// (ErrTargetTaken). Set before Bind; not safe to call concurrently with it.
func (s *Sink) SetLeft(left func(oid uint32) bool) { s.leftFn = left }
