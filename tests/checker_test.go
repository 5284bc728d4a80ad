package tests

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// oracle is the source of truth the checker compares delivery with.
type oracle interface {
	// Rows returns the upstream's rows of table with commit-ts in (lo, hi],
	// in (commit-ts, start-ts, key) order.
	Rows(table int64, lo, hi common.Ts) []common.Row
	// DDLs returns the table's DDLs with commit-ts in (lo, hi], in order.
	DDLs(table int64, lo, hi common.Ts) []schemastore.DDL
	// Ceiling is, read now, the highest resolved-ts any dispatcher of table
	// may have been told: min(upstream frontier, schema frontier).
	Ceiling(table int64) common.Ts
}

// errInjected is the error a checker returns for an injected sink failure.
var errInjected = errors.New("tests: injected sink failure")

// checkerForTest is an eventcollector.Sink that verifies every dispatcher's stream
// as it is applied, the way a downstream would see it, against an oracle:
//
//   - per epoch, rows strictly increase in (commit-ts, start-ts, key), so a
//     row applied twice in one epoch or out of order is caught at once;
//   - a DDL comes after every row of its commit-ts and before any later row;
//   - nothing applied is at or below the epoch's last checkpoint (a
//     resolved-ts is never ahead of the rows sent);
//   - each checkpoint is above the previous one (resolved-ts monotonic, also
//     across epochs), at most the oracle's ceiling, and when it arrives the
//     rows and DDLs applied since the previous checkpoint of the epoch are
//     exactly the oracle's in that range: nothing missing, nothing extra.
//
// Checkpoints chain: an epoch starts at (or below) the last checkpoint, so
// the checkpointed ranges cover (start-ts, final checkpoint] without a gap,
// and a final checkpoint equal to the upstream's final resolved-ts proves
// every row was delivered. Only the rows since the last checkpoint are kept,
// so the checker's memory does not grow with the run.
type checkerForTest struct {
	oracle oracle

	mu struct {
		sync.Mutex
		ds          map[common.DispatcherID]*dstate
		violations  []string
		nViolations int
		// changed is closed and replaced at the next checkpoint once
		// someone waits on it.
		changed chan struct{}
		watched bool
		// target, remaining and done track waitAll.
		target    common.Ts
		remaining int
		done      chan struct{}
		stats     checkerStats
	}
}

// checkerStats are totals over every dispatcher.
type checkerStats struct {
	RowsApplied, DDLsApplied, Checkpoints uint64
	Epochs, SinkErrors                    uint64
}

// dstate is one dispatcher instance as the checker sees it.
type dstate struct {
	table   int64
	live    bool
	startTs common.Ts
	// ckpt is the highest confirmed checkpoint (startTs at first).
	ckpt   common.Ts
	epoch  uint64
	epochs int
	// The current epoch: checked is how far it was verified (its start,
	// then its last checkpoint); rows and ddls are applied since then.
	begun   bool
	checked common.Ts
	rows    []common.Row
	ddls    []messaging.DDL
	last    *common.Row
	lastDDL common.Ts
	reached bool
	// failNext makes the next ApplyRows fail (an injected sink error).
	failNext bool
}

const maxViolations = 20

var _ eventcollector.Sink = (*checkerForTest)(nil)

func newCheckerForTest(o oracle) *checkerForTest {
	c := &checkerForTest{oracle: o}
	c.mu.ds = make(map[common.DispatcherID]*dstate)
	c.mu.changed = make(chan struct{})
	return c
}

// violationLocked records a broken guarantee. REQUIRES: c.mu held.
func (c *checkerForTest) violationLocked(id common.DispatcherID, format string, args ...any) {
	c.mu.nViolations++
	if len(c.mu.violations) < maxViolations {
		c.mu.violations = append(c.mu.violations, fmt.Sprintf("%v: ", id)+fmt.Sprintf(format, args...))
	}
}

// violations returns how many guarantees broke and the first few.
func (c *checkerForTest) violations() (int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.nViolations, append([]string(nil), c.mu.violations...)
}

// bind declares dispatcher id on table from startTs, before it is added to
// the collector, so its first sink call is expected. An ID removed before
// (unbound) may be bound again, as a new registration (a table that moved
// back): its state starts afresh, so a late sink call of the earlier
// registration, which RemoveDispatcher must have ruled out, shows up as a
// violation of the new one.
func (c *checkerForTest) bind(id common.DispatcherID, table int64, startTs common.Ts) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.mu.ds[id]; ok && old.live {
		c.violationLocked(id, "bound twice while live")
		return
	}
	d := &dstate{table: table, live: true, startTs: startTs, ckpt: startTs}
	c.mu.ds[id] = d
	if c.mu.target != 0 && d.ckpt < c.mu.target {
		c.mu.remaining++
	}
}

// unbind forgets id after its removal: a sink call still in flight is
// ignored, and waitAll no longer waits for it.
func (c *checkerForTest) unbind(id common.DispatcherID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.mu.ds[id]
	if !ok || !d.live {
		return
	}
	d.live = false
	d.rows, d.ddls = nil, nil
	if c.mu.target != 0 && d.ckpt < c.mu.target {
		c.doneOneLocked()
	}
}

// failNextRows makes the next ApplyRows of id return an error.
func (c *checkerForTest) failNextRows(id common.DispatcherID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.mu.ds[id]; ok {
		d.failNext = true
	}
}

// lookupLocked returns id's live state, or nil for a removed instance (a
// sink call that was in flight at removal). REQUIRES: c.mu held.
func (c *checkerForTest) lookupLocked(id common.DispatcherID) *dstate {
	d, ok := c.mu.ds[id]
	if !ok {
		c.violationLocked(id, "sink call for a dispatcher never added")
		return nil
	}
	if !d.live {
		return nil
	}
	return d
}

// BeginEpoch implements eventcollector.Sink.
func (c *checkerForTest) BeginEpoch(id common.DispatcherID, epoch uint64, startTs common.Ts) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.lookupLocked(id)
	if d == nil {
		return nil
	}
	if d.begun && epoch <= d.epoch {
		c.violationLocked(id, "epoch %d begun after epoch %d", epoch, d.epoch)
	}
	if startTs > d.ckpt {
		c.violationLocked(id, "epoch %d starts at %v, above the checkpoint %v: rows would be skipped", epoch, startTs, d.ckpt)
	}
	d.begun, d.epoch, d.epochs = true, epoch, d.epochs+1
	d.checked, d.rows, d.ddls, d.last, d.lastDDL = startTs, nil, nil, nil, 0
	c.mu.stats.Epochs++
	return nil
}

// ApplyRows implements eventcollector.Sink.
func (c *checkerForTest) ApplyRows(id common.DispatcherID, rows []common.Row) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.lookupLocked(id)
	if d == nil {
		return nil
	}
	if d.failNext {
		d.failNext = false
		c.mu.stats.SinkErrors++
		return errInjected
	}
	if !d.begun {
		c.violationLocked(id, "rows before the first epoch began")
	}
	for i := range rows {
		r := &rows[i]
		switch {
		case r.CommitTs <= d.checked:
			c.violationLocked(id, "epoch %d: row %x@%v at or below the verified resolved-ts %v", d.epoch, r.Key, r.CommitTs, d.checked)
		case r.CommitTs <= d.lastDDL:
			c.violationLocked(id, "epoch %d: row %x@%v after the DDL at %v", d.epoch, r.Key, r.CommitTs, d.lastDDL)
		}
		if d.last != nil {
			switch cmpRows(d.last, r) {
			case 0:
				c.violationLocked(id, "epoch %d: row %x@%v applied twice", d.epoch, r.Key, r.CommitTs)
			case 1:
				c.violationLocked(id, "epoch %d: row %x@%v after %x@%v", d.epoch, r.Key, r.CommitTs, d.last.Key, d.last.CommitTs)
			}
		}
		d.last = r
	}
	d.rows = append(d.rows, rows...)
	c.mu.stats.RowsApplied += uint64(len(rows))
	return nil
}

// ApplyDDL implements eventcollector.Sink.
func (c *checkerForTest) ApplyDDL(id common.DispatcherID, ddl *messaging.DDL) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.lookupLocked(id)
	if d == nil {
		return nil
	}
	switch {
	case ddl.TableID != d.table:
		c.violationLocked(id, "DDL of table %d for a dispatcher of table %d", ddl.TableID, d.table)
	case ddl.CommitTs <= d.checked:
		c.violationLocked(id, "epoch %d: DDL@%v at or below the verified resolved-ts %v", d.epoch, ddl.CommitTs, d.checked)
	case ddl.CommitTs <= d.lastDDL:
		c.violationLocked(id, "epoch %d: DDL@%v after the DDL at %v", d.epoch, ddl.CommitTs, d.lastDDL)
	case d.last != nil && ddl.CommitTs < d.last.CommitTs:
		c.violationLocked(id, "epoch %d: DDL@%v after a row at %v", d.epoch, ddl.CommitTs, d.last.CommitTs)
	}
	d.lastDDL = ddl.CommitTs
	d.ddls = append(d.ddls, *ddl)
	c.mu.stats.DDLsApplied++
	return nil
}

// Checkpoint implements eventcollector.Sink: it verifies the range
// (checked, ts] of the epoch against the oracle.
func (c *checkerForTest) Checkpoint(id common.DispatcherID, ts common.Ts) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.lookupLocked(id)
	if d == nil {
		return nil
	}
	c.mu.stats.Checkpoints++
	if ts <= d.ckpt {
		c.violationLocked(id, "checkpoint %v not above the previous %v (resolved-ts regressed)", ts, d.ckpt)
	}
	if ceil := c.oracle.Ceiling(d.table); ts > ceil {
		c.violationLocked(id, "checkpoint %v above the upstream/schema frontier %v", ts, ceil)
	}
	// Rows and DDLs above ts may already be applied; they are verified by
	// a later checkpoint.
	nr := 0
	for nr < len(d.rows) && d.rows[nr].CommitTs <= ts {
		nr++
	}
	nd := 0
	for nd < len(d.ddls) && d.ddls[nd].CommitTs <= ts {
		nd++
	}
	c.compareRowsLocked(id, d, d.rows[:nr], c.oracle.Rows(d.table, d.checked, ts), ts)
	c.compareDDLsLocked(id, d, d.ddls[:nd], c.oracle.DDLs(d.table, d.checked, ts), ts)
	d.rows = append([]common.Row(nil), d.rows[nr:]...)
	d.ddls = append([]messaging.DDL(nil), d.ddls[nd:]...)
	d.checked, d.ckpt = ts, max(d.ckpt, ts)
	if c.mu.target != 0 && !d.reached && d.ckpt >= c.mu.target {
		d.reached = true
		c.doneOneLocked()
	}
	if c.mu.watched {
		close(c.mu.changed)
		c.mu.changed = make(chan struct{})
		c.mu.watched = false
	}
	return nil
}

func (c *checkerForTest) compareRowsLocked(id common.DispatcherID, d *dstate, got, want []common.Row, ts common.Ts) {
	i, j := 0, 0
	for (i < len(want) || j < len(got)) && c.mu.nViolations < 1000 {
		switch {
		case j == len(got) || (i < len(want) && cmpRows(&want[i], &got[j]) < 0):
			c.violationLocked(id, "epoch %d checkpoint %v: row %x@%v (start %v) missing", d.epoch, ts, want[i].Key, want[i].CommitTs, want[i].StartTs)
			i++
		case i == len(want) || cmpRows(&want[i], &got[j]) > 0:
			c.violationLocked(id, "epoch %d checkpoint %v: unexpected row %x@%v", d.epoch, ts, got[j].Key, got[j].CommitTs)
			j++
		default:
			if want[i].Op != got[j].Op || !bytes.Equal(want[i].Value, got[j].Value) {
				c.violationLocked(id, "epoch %d: row %x@%v differs from the upstream's", d.epoch, got[j].Key, got[j].CommitTs)
			}
			i++
			j++
		}
	}
}

func (c *checkerForTest) compareDDLsLocked(id common.DispatcherID, d *dstate, got []messaging.DDL, want []schemastore.DDL, ts common.Ts) {
	if len(got) != len(want) {
		c.violationLocked(id, "epoch %d checkpoint %v: %d DDLs applied in (%v, %v], want %d", d.epoch, ts, len(got), d.checked, ts, len(want))
		return
	}
	for i := range want {
		if got[i].CommitTs != want[i].CommitTs || got[i].Query != want[i].Query {
			c.violationLocked(id, "epoch %d: DDL %q@%v, want %q@%v", d.epoch, got[i].Query, got[i].CommitTs, want[i].Query, want[i].CommitTs)
		}
	}
}

// REQUIRES: c.mu held.
func (c *checkerForTest) doneOneLocked() {
	c.mu.remaining--
	if c.mu.remaining == 0 && c.mu.done != nil {
		close(c.mu.done)
		c.mu.done = nil
	}
}

// waitAll waits until every live dispatcher's checkpoint reached target,
// or ctx ends. target must not change between calls.
func (c *checkerForTest) waitAll(ctx context.Context, target common.Ts) error {
	c.mu.Lock()
	if c.mu.target != target {
		c.mu.target, c.mu.remaining = target, 0
		for _, d := range c.mu.ds {
			d.reached = d.ckpt >= target
			if d.live && !d.reached {
				c.mu.remaining++
			}
		}
	}
	if c.mu.remaining == 0 {
		c.mu.Unlock()
		return nil
	}
	if c.mu.done == nil {
		c.mu.done = make(chan struct{})
	}
	done := c.mu.done
	c.mu.Unlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wait returns once cond (run without the checker's lock) holds, checking
// it now and after every checkpoint, or ctx.Err().
func (c *checkerForTest) wait(ctx context.Context, cond func() bool) error {
	for {
		c.mu.Lock()
		c.mu.watched = true
		changed := c.mu.changed
		c.mu.Unlock()
		if cond() {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// waitFor is wait with a timeout that fails t (a hang guard only: no
// event is ordered by time).
func (c *checkerForTest) waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := c.wait(ctx, cond); err != nil {
		t.Fatalf("timed out after %v waiting for: %s", timeout, what)
	}
}

// checkpoint returns id's highest confirmed checkpoint.
func (c *checkerForTest) checkpoint(id common.DispatcherID) common.Ts {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.mu.ds[id]; ok {
		return d.ckpt
	}
	return 0
}

// behind returns up to n live dispatchers whose checkpoint is below
// target, with their state, for failure messages.
func (c *checkerForTest) behind(target common.Ts, n int) []behindDispatcher {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []behindDispatcher
	for id, d := range c.mu.ds {
		if d.live && d.ckpt < target && len(out) < n {
			out = append(out, behindDispatcher{id: id,
				state: fmt.Sprintf("%v table %d: checkpoint %v < %v (epoch %d, %d epochs)", id, d.table, d.ckpt, target, d.epoch, d.epochs)})
		}
	}
	return out
}

// behindDispatcher is a live dispatcher behind a target, with the
// checker's view of it.
type behindDispatcher struct {
	id    common.DispatcherID
	state string
}

// stats returns the totals.
func (c *checkerForTest) stats() checkerStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.stats
}

// resets returns the epochs begun beyond each instance's first: the resets
// the downstream observed.
func (c *checkerForTest) resets() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n uint64
	for _, d := range c.mu.ds {
		if d.epochs > 1 {
			n += uint64(d.epochs - 1)
		}
	}
	return n
}

// cmpRows orders rows like the store: commit-ts, start-ts, key.
func cmpRows(a, b *common.Row) int {
	if c := cmp.Compare(a.CommitTs, b.CommitTs); c != 0 {
		return c
	}
	if c := cmp.Compare(a.StartTs, b.StartTs); c != 0 {
		return c
	}
	return bytes.Compare(a.Key, b.Key)
}
