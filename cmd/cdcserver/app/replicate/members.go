package replicate

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/cdcflow/eventservice/pkg/pgsource"
)

// members keeps, in the target's cdcflow.state (membersKey), the
// publication's oid and the membership row (pg_publication_rel's oid)
// under which each published table's changes were last streamed into the
// target (pgsource.Membership).
//
// Why: a table removed from the publication and added again while no
// serve ran has had changes the stream never carried (pgoutput decides by
// the publication as it was at each change), and neither the slot nor the
// checkpoints tell: the table is published at the start as before, with a
// checkpoint. Its membership row is new, though, so a start that finds a
// row other than the recorded one copies the table anew, emptied first.
//
// Order: a start lists such tables as fresh copies (copier.list) before
// it records the rows it found, and a table that joins or joins again
// while running is listed before its row is recorded, so a crash between
// the two copies it again rather than forgetting it. A table's recorded
// row is kept while it is out of the publication (so that its return
// shows as a new row, however many starts it sat out) and replaced only
// by its next row. A table without a row (FOR ALL TABLES, FOR TABLES IN
// SCHEMA) is not recorded and not checked. A publication dropped and
// created again (or a pg_upgrade that recreated it) has a new oid and new
// rows for every table: the recorded rows are then dropped, not compared,
// since copying every table anew is not what such a change asks for.
type members struct {
	p   *parts
	key string

	mu       sync.Mutex
	recorded memberRecord
}

// memberRecord is what the state holds: the publication's oid and the
// tables' rows.
type memberRecord struct {
	publication uint32
	rows        map[uint32]uint32
}

func membersKey(slot string) string { return "members:" + slot }

func newMembers(p *parts, slot string) *members {
	return &members{p: p, key: membersKey(slot), recorded: memberRecord{rows: map[uint32]uint32{}}}
}

// load reads the record.
func (m *members) load(ctx context.Context) (memberRecord, error) {
	v, _, err := m.p.sink.State(ctx, m.key)
	if err != nil {
		return memberRecord{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recorded = parseMembers(v)
	return m.recorded, nil
}

// rejoinedWhileDown returns the tables of written (bound before, with a
// checkpoint) whose recorded row differs from the current one (both
// known, under the same publication): removed and added again since.
func rejoinedWhileDown(recorded memberRecord, current pgsource.Membership, written []uint32) []uint32 {
	if recorded.publication != current.Publication {
		return nil
	}
	var out []uint32
	for _, oid := range written {
		if was, now := recorded.rows[oid], current.Rows[oid]; was != 0 && now != 0 && was != now {
			out = append(out, oid)
		}
	}
	return out
}

// record records current over the record, durably: the current rows
// replace the recorded ones, a table without a current row keeps its
// recorded one, and another publication's rows are dropped.
func (m *members) record(ctx context.Context, current pgsource.Membership) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.saveLocked(ctx, mergeMembers(m.recorded, current))
}

// mergeMembers is record's new record (see record).
func mergeMembers(recorded memberRecord, current pgsource.Membership) memberRecord {
	next := memberRecord{publication: current.Publication, rows: maps.Clone(current.Rows)}
	if recorded.publication == current.Publication {
		for oid, row := range recorded.rows {
			if _, ok := next.rows[oid]; !ok {
				next.rows[oid] = row
			}
		}
	}
	return next
}

// recordOne records oid's row in current (a table that joined while
// running, once listed), keeping the others as recorded: another table's
// new row may belong to a rejoin not handled yet.
func (m *members) recordOne(ctx context.Context, oid uint32, current pgsource.Membership) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	row, ok := current.Rows[oid]
	if !ok || m.recorded.publication == current.Publication && m.recorded.rows[oid] == row {
		return nil
	}
	next := memberRecord{publication: current.Publication, rows: map[uint32]uint32{}}
	if m.recorded.publication == current.Publication {
		next.rows = maps.Clone(m.recorded.rows)
	}
	next.rows[oid] = row
	return m.saveLocked(ctx, next)
}

func (m *members) saveLocked(ctx context.Context, next memberRecord) error {
	if err := m.p.sink.SetState(ctx, m.key, formatMembers(next)); err != nil {
		return err
	}
	m.recorded = next
	return nil
}

// parseMembers reads a record ("publication=oid" and "table:row" entries,
// comma-separated), skipping what is not an entry of OIDs: the state is
// the target's, and hostile until read.
func parseMembers(v string) memberRecord {
	out := memberRecord{rows: map[uint32]uint32{}}
	oid := func(s string) uint32 {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return 0
		}
		return uint32(n)
	}
	for _, f := range strings.Split(v, ",") {
		if p, ok := strings.CutPrefix(f, "publication="); ok {
			out.publication = oid(p)
			continue
		}
		table, row, ok := strings.Cut(f, ":")
		if !ok {
			continue
		}
		if t, r := oid(table), oid(row); t != 0 && r != 0 {
			out.rows[t] = r
		}
	}
	return out
}

// formatMembers writes a record as parseMembers reads it, tables in order.
func formatMembers(m memberRecord) string {
	var b strings.Builder
	b.WriteString("publication=")
	b.WriteString(strconv.FormatUint(uint64(m.publication), 10))
	for _, t := range slices.Sorted(maps.Keys(m.rows)) {
		b.WriteByte(',')
		b.WriteString(strconv.FormatUint(uint64(t), 10))
		b.WriteByte(':')
		b.WriteString(strconv.FormatUint(uint64(m.rows[t]), 10))
	}
	return b.String()
}
