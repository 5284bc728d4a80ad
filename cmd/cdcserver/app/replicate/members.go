package replicate

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// members keeps, in the target's cdcflow.state (membersKey), the
// membership row (pg_publication_rel's oid) under which each published
// table's changes were last streamed into the target.
//
// Why: a table removed from the publication and added again while no
// serve ran has had changes the stream never carried (pgoutput decides by
// the publication as it was at each change), and neither the slot nor the
// checkpoints tell: the table is published at the start as before, with a
// checkpoint. Its membership row is new, though, so a start that finds a
// row other than the recorded one copies the table anew, emptied first.
//
// Order: a start lists such tables as fresh copies (copier.list) before
// it records the rows it found, and a table that joins while running is
// listed before its row is recorded, so a crash between the two copies it
// again rather than forgetting it. A table without a row (FOR ALL TABLES,
// FOR TABLES IN SCHEMA) is not recorded and not checked.
type members struct {
	p   *parts
	key string

	mu   sync.Mutex
	rows map[uint32]uint32 // as the target's state holds them
}

func membersKey(slot string) string { return "members:" + slot }

func newMembers(p *parts, slot string) *members {
	return &members{p: p, key: membersKey(slot), rows: map[uint32]uint32{}}
}

// load reads the recorded rows.
func (m *members) load(ctx context.Context) (map[uint32]uint32, error) {
	v, _, err := m.p.sink.State(ctx, m.key)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rows = parseMembers(v)
	return m.rows, nil
}

// rejoinedWhileDown returns the tables of published whose recorded row differs
// from the current one (both known): removed and added again since.
func rejoinedWhileDown(recorded, current map[uint32]uint32, published []uint32) []uint32 {
	var out []uint32
	for _, oid := range published {
		if was, now := recorded[oid], current[oid]; was != 0 && now != 0 && was != now {
			out = append(out, oid)
		}
	}
	return out
}

// record replaces the recorded rows with current, durably.
func (m *members) record(ctx context.Context, current map[uint32]uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.p.sink.SetState(ctx, m.key, formatMembers(current)); err != nil {
		return err
	}
	m.rows = current
	return nil
}

// recordOne records oid's row in current (a table that joined while
// running, once listed), keeping the others as recorded: another table's
// new row may belong to a rejoin not handled yet.
func (m *members) recordOne(ctx context.Context, oid uint32, current map[uint32]uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	row, ok := current[oid]
	if !ok || m.rows[oid] == row {
		return nil
	}
	rows := make(map[uint32]uint32, len(m.rows)+1)
	for k, v := range m.rows {
		rows[k] = v
	}
	rows[oid] = row
	if err := m.p.sink.SetState(ctx, m.key, formatMembers(rows)); err != nil {
		return err
	}
	m.rows = rows
	return nil
}

// parseMembers reads the recorded rows ("table:row", comma-separated),
// skipping what is not a pair of OIDs: the state is the target's, and
// hostile until read.
func parseMembers(v string) map[uint32]uint32 {
	out := map[uint32]uint32{}
	for _, f := range strings.Split(v, ",") {
		table, row, ok := strings.Cut(f, ":")
		if !ok {
			continue
		}
		t, err1 := strconv.ParseUint(table, 10, 32)
		r, err2 := strconv.ParseUint(row, 10, 32)
		if err1 == nil && err2 == nil && t != 0 && r != 0 {
			out[uint32(t)] = uint32(r)
		}
	}
	return out
}

// formatMembers writes rows as parseMembers reads them, in table order.
func formatMembers(rows map[uint32]uint32) string {
	tables := make([]uint32, 0, len(rows))
	for t := range rows {
		tables = append(tables, t)
	}
	slices.Sort(tables)
	var b strings.Builder
	for i, t := range tables {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(t), 10))
		b.WriteByte(':')
		b.WriteString(strconv.FormatUint(uint64(rows[t]), 10))
	}
	return b.String()
}
