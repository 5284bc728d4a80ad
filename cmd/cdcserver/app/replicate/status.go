package replicate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcflow/eventservice/internal/pglink"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
	"github.com/cdcflow/eventservice/pkg/pgsink"
	"github.com/cdcflow/eventservice/pkg/pgsource"
)

// Status is a changefeed as `cdcserver status` shows it, read from both
// databases whether or not a serve runs: what it is bound to, the WAL its
// slot holds the source to, and each table's progress.
type Status struct {
	Slot        string `json:"slot"`
	Publication string `json:"publication"`
	Source      string `json:"source"`
	Target      string `json:"target"`
	// Binding: the source's registry row for the slot, and what the
	// target's owner row says.
	Registered   bool      `json:"registered"`
	RegisteredTo string    `json:"registered_target,omitempty"`
	RegisteredAt time.Time `json:"registered_at,omitzero"`
	BoundHere    bool      `json:"bound_to_this_target"`
	// CreatedPublication: the changefeed created the publication (remove
	// drops it).
	CreatedPublication bool             `json:"created_publication"`
	OtherOwners        []string         `json:"other_changefeeds_in_target,omitempty"`
	SlotStats          SlotStatus       `json:"slot_state"`
	Snapshot           string           `json:"snapshot"`
	Tables             []TableStatus    `json:"tables"`
	LeftOut            []LeftOutTable   `json:"left_out,omitempty"`
	Problems           []string         `json:"problems,omitempty"`
	Counts             map[string]int   `json:"counts"`
	Lag                *durationSeconds `json:"slowest_checkpoint_lag_seconds,omitempty"`
	Read               time.Time        `json:"read_at"`
	// rule is the registered --include/--exclude.
	rule pgsource.TableRule
}

// SlotStatus is the slot as the server describes it.
type SlotStatus struct {
	Exists           bool   `json:"exists"`
	Active           bool   `json:"active"`
	ActivePID        int32  `json:"active_pid,omitempty"`
	RetainedBytes    int64  `json:"retained_bytes"`
	UnconfirmedBytes int64  `json:"unconfirmed_bytes"`
	WALStatus        string `json:"wal_status,omitempty"`
	SafeWALSize      *int64 `json:"safe_wal_size_bytes,omitempty"`
}

// TableStatus is one table of the changefeed.
type TableStatus struct {
	Table      string           `json:"table"`
	OID        uint32           `json:"oid"`
	Checkpoint time.Time        `json:"checkpoint,omitzero"`
	Lag        *durationSeconds `json:"lag_seconds,omitempty"`
	// State: replicating, stopped, released (stopped, its hold on the
	// slot let go), copy owed, fresh copy owed, no checkpoint yet.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// InsertsOnly: the table has no key and not REPLICA IDENTITY FULL, so
	// only its inserts and truncates are replicated (its updates and
	// deletes, which the source still allows, are not).
	InsertsOnly bool `json:"inserts_only,omitempty"`
}

// LeftOutTable is a table of the publication the changefeed cannot
// replicate, with why.
type LeftOutTable struct {
	Table  string `json:"table"`
	Reason string `json:"reason"`
}

// durationSeconds is a duration that reads as seconds in JSON.
type durationSeconds time.Duration

func (d durationSeconds) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).Seconds())
}

// UnmarshalJSON reads what MarshalJSON wrote (a cluster's API relays a
// status as JSON).
func (d *durationSeconds) UnmarshalJSON(b []byte) error {
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return err
	}
	*d = durationSeconds(secs * float64(time.Second))
	return nil
}

// ReadStatus reads the changefeed of slot between source and sink.
func ReadStatus(ctx context.Context, source, sink, slot, publication string) (*Status, error) {
	src, err := pgsource.Connect(ctx, source)
	if err != nil {
		return nil, fmt.Errorf("%w: the source: %s", ErrSetup, pglink.Cause(err))
	}
	defer src.Close(context.Background())
	dst, err := pgsink.Connect(ctx, sink)
	if err != nil {
		return nil, fmt.Errorf("%w: the target: %s", ErrSetup, pglink.Cause(err))
	}
	defer dst.Close(context.Background())
	srcID, err := pglink.Identify(ctx, src)
	if err != nil {
		return nil, fmt.Errorf("%w: the source: %w", ErrSetup, err)
	}
	dstID, err := pglink.Identify(ctx, dst)
	if err != nil {
		return nil, fmt.Errorf("%w: the target: %w", ErrSetup, err)
	}
	now := time.Now()
	st := &Status{Slot: slot, Publication: publication, Source: fmt.Sprintf("%s/%s", srcID.Address, srcID.Database),
		Target: fmt.Sprintf("%s/%s", dstID.Address, dstID.Database), Counts: map[string]int{}, Read: now.UTC()}
	reg, found, err := pgsource.LoadRegistration(ctx, src, slot)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	if found {
		st.Registered, st.RegisteredTo, st.RegisteredAt = true, reg.Target, reg.RegisteredAt.UTC()
		st.BoundHere, st.CreatedPublication, st.rule = reg.TargetID.Same(dstID), reg.CreatedPublication, reg.Tables
		if reg.Publication != "" {
			st.Publication = reg.Publication
		}
	}
	owners, err := pgsink.ReadOwners(ctx, dst)
	if err != nil {
		return nil, fmt.Errorf("%w: the target's changefeeds: %w", ErrSetup, err)
	}
	ownedHere := false
	for _, o := range owners {
		switch {
		case o.Name != slot:
			st.OtherOwners = append(st.OtherOwners, o.Name)
		case o.Source != "" && o.Source != srcID.Key():
			st.Problems = append(st.Problems, fmt.Sprintf("the target's changefeed %q replicates another source (%s)", o.Name, o.Source))
		default:
			ownedHere = true
		}
	}
	if found && !st.BoundHere {
		st.Problems = append(st.Problems, fmt.Sprintf("slot %s is registered for another target: %s", slot, reg.Target))
	}
	ss, err := pgsource.ReadSlotStats(ctx, src, slot)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	st.SlotStats = SlotStatus{Exists: ss.Exists, Active: ss.ActivePID != 0, ActivePID: ss.ActivePID, RetainedBytes: ss.RetainedBytes,
		UnconfirmedBytes: ss.UnconfirmedBytes, WALStatus: ss.WALStatus}
	if ss.SafeWALSizeKnown {
		v := ss.SafeWALSize
		st.SlotStats.SafeWALSize = &v
	}
	if ss.WALStatus == "lost" {
		st.Problems = append(st.Problems, fmt.Sprintf("the server invalidated the slot (wal_status lost): the changefeed cannot resume; "+
			"to start over with a new snapshot, SELECT pg_drop_replication_slot('%s') on the source and start serve", slot))
	}
	if !ss.Exists && (found || ownedHere) {
		st.Problems = append(st.Problems, "the slot is missing: the next start creates it and copies every table anew")
	}
	state, err := readState(ctx, dst, slot)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	switch {
	case !ownedHere && !found:
		st.Snapshot = "none (no changefeed of this slot here)"
	case state[snapshotKey(slot)] != "":
		st.Snapshot = "applied"
	default:
		st.Snapshot = "not applied (a start copies every table)"
	}
	if err := st.readTables(ctx, src, dst, state, now); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	return st, nil
}

// readState reads the target's cdcflow.state rows of the slot.
func readState(ctx context.Context, dst *pgx.Conn, slot string) (map[string]string, error) {
	out := map[string]string{}
	var exists bool
	if err := dst.QueryRow(ctx, "SELECT to_regclass('cdcflow.state') IS NOT NULL").Scan(&exists); err != nil || !exists {
		return out, err
	}
	rows, err := dst.Query(ctx, "SELECT key, value FROM cdcflow.state WHERE key LIKE '%:' || $1", slot)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, rows.Err()
}

// readTables fills the tables: the publication's, with their checkpoints,
// what stopped and what is owed a copy.
func (st *Status) readTables(ctx context.Context, src, dst *pgx.Conn, state map[string]string, now time.Time) error {
	tables, err := pgsource.ListTables(ctx, src, st.Publication)
	if err != nil {
		return err
	}
	left, err := pgsource.LeftOutTables(ctx, src, st.Publication, st.CreatedPublication, st.rule)
	if err != nil {
		return err
	}
	for _, l := range left {
		st.LeftOut = append(st.LeftOut, LeftOutTable{Table: l.Table, Reason: l.Reason})
	}
	ckpts := map[uint32]common.Ts{}
	var exists bool
	if err := dst.QueryRow(ctx, "SELECT to_regclass('cdcflow.checkpoints') IS NOT NULL").Scan(&exists); err != nil {
		return err
	}
	if exists {
		rows, err := dst.Query(ctx, "SELECT table_oid, ts FROM cdcflow.checkpoints WHERE table_oid BETWEEN 1 AND 4294967295 AND ts >= 0")
		if err != nil {
			return err
		}
		for rows.Next() {
			var oid, ts int64
			if err := rows.Scan(&oid, &ts); err != nil {
				rows.Close()
				return err
			}
			ckpts[uint32(oid)] = common.Ts(ts)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	copies := parseCopies(state[copiesKey(st.Slot)])
	stopped := map[uint32]stoppedRecord{}
	if recs, ok := parseStopped(state[stoppedKey(st.Slot)]); ok {
		for _, r := range recs {
			stopped[r.OID] = r
		}
	} else {
		st.Problems = append(st.Problems, "the target's list of stopped tables does not read")
	}
	var slowest common.Ts
	for _, t := range tables {
		if t.Err != nil {
			continue // left out (above)
		}
		ts := TableStatus{Table: t.Name, OID: t.OID, State: "replicating", InsertsOnly: t.Identity == pgcodec.IdentityNone}
		if c, ok := ckpts[t.OID]; ok {
			ts.Checkpoint = c.Physical().UTC()
			d := durationSeconds(max(0, now.Sub(c.Physical())))
			ts.Lag = &d
			if slowest == 0 || c < slowest {
				slowest = c
			}
		} else {
			ts.State = "no checkpoint yet"
		}
		if fresh, owed := copies[t.OID]; owed {
			ts.State = "copy owed"
			if fresh {
				ts.State = "fresh copy owed"
			}
		}
		if r, ok := stopped[t.OID]; ok {
			ts.State, ts.Reason = "stopped", r.Reason
			if r.Released {
				ts.State = "released"
				ts.Reason = r.Reason + " (its hold on the slot let go past --max-retained-wal: a fresh copy is owed)"
			}
		}
		st.Counts[ts.State]++
		st.Tables = append(st.Tables, ts)
	}
	if slowest != 0 {
		d := durationSeconds(max(0, now.Sub(slowest.Physical())))
		st.Lag = &d
	}
	sort.Slice(st.Tables, func(i, j int) bool { return st.Tables[i].Table < st.Tables[j].Table })
	return nil
}

// WriteText writes the status as an operator reads it.
func (st *Status) WriteText(w io.Writer) {
	fmt.Fprintf(w, "changefeed %s: %s -> %s (publication %s)\n", st.Slot, st.Source, st.Target, st.Publication)
	switch {
	case st.Registered && st.BoundHere:
		fmt.Fprintf(w, "  binding    registered %s for this target", st.RegisteredAt.Format(time.RFC3339))
	case st.Registered:
		fmt.Fprintf(w, "  binding    registered for ANOTHER target: %s", st.RegisteredTo)
	default:
		fmt.Fprintf(w, "  binding    not registered on the source")
	}
	if st.CreatedPublication {
		fmt.Fprintf(w, "; it created the publication")
	}
	fmt.Fprintln(w)
	if len(st.OtherOwners) > 0 {
		fmt.Fprintf(w, "  target     holds other changefeeds: %s\n", strings.Join(st.OtherOwners, ", "))
	}
	s := st.SlotStats
	switch {
	case !s.Exists:
		fmt.Fprintf(w, "  slot       missing\n")
	default:
		active := "inactive (no serve streams it)"
		if s.Active {
			active = fmt.Sprintf("active (walsender pid %d)", s.ActivePID)
		}
		safe := "unlimited (max_slot_wal_keep_size = -1)"
		if s.SafeWALSize != nil {
			safe = bytesText(*s.SafeWALSize)
		}
		fmt.Fprintf(w, "  slot       %s; retains %s of WAL, %s unconfirmed; wal_status %s; safe_wal_size %s\n",
			active, bytesText(s.RetainedBytes), bytesText(s.UnconfirmedBytes), s.WALStatus, safe)
	}
	fmt.Fprintf(w, "  snapshot   %s\n", st.Snapshot)
	var counts []string
	for _, k := range []string{"replicating", "no checkpoint yet", "copy owed", "fresh copy owed", "stopped", "released"} {
		if n := st.Counts[k]; n > 0 {
			counts = append(counts, fmt.Sprintf("%d %s", n, k))
		}
	}
	lag := "-"
	if st.Lag != nil {
		lag = time.Duration(*st.Lag).Round(time.Millisecond).String()
	}
	fmt.Fprintf(w, "  tables     %s; the slowest checkpoint is %s old\n", strings.Join(counts, ", "), lag)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  TABLE\tCHECKPOINT\tLAG\tSTATE\n")
	for _, t := range st.Tables {
		ck, lg := "-", "-"
		if !t.Checkpoint.IsZero() {
			ck = t.Checkpoint.Format(time.RFC3339Nano)
		}
		if t.Lag != nil {
			lg = time.Duration(*t.Lag).Round(time.Millisecond).String()
		}
		state := t.State
		if t.Reason != "" {
			state += ": " + t.Reason
		}
		if t.InsertsOnly {
			state += " (inserts only: no key or REPLICA IDENTITY FULL, so its updates and deletes are not replicated)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", t.Table, ck, lg, state)
	}
	_ = tw.Flush()
	for _, l := range st.LeftOut {
		fmt.Fprintf(w, "  left out   %s: %s\n", l.Table, l.Reason)
	}
	for _, p := range st.Problems {
		fmt.Fprintf(w, "  PROBLEM    %s\n", p)
	}
}

// bytesText is n bytes as an operator reads them.
func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f, u := float64(n), 0
	for f >= unit && u < 4 {
		f /= unit
		u++
	}
	return fmt.Sprintf("%.1f %ciB", f, "KMGT"[u-1])
}

// errStatusProblem marks a status that found problems (exit 1).
var errStatusProblem = errors.New("the changefeed has problems")

// StatusExit is what status exits with: nil when there is nothing to
// act on, errStatusProblem otherwise.
func (st *Status) StatusExit() error {
	if len(st.Problems) > 0 || st.Counts["stopped"] > 0 || st.Counts["released"] > 0 {
		return errStatusProblem
	}
	return nil
}
