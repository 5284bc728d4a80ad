package pgsink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// The owner fence. A sink that dies (SIGKILL, a lost host) can leave a
// transaction behind in the target: a lane's pipeline the server had
// received in full runs to its commit after its client is gone. A sink
// that started meanwhile would then have its own writes (a reset's
// TRUNCATE, newer rows) overwritten by older ones, a difference no later
// change repairs. And a sink that was only paused (a stopped VM) may wake
// up and go on writing what it held.
//
// So every sink has an owner name and a generation in the target
// (cdcflow.owners). Every write transaction of a sink first calls
// cdcflow.fence(owner, generation), which takes a shared transaction-level
// advisory lock of the owner and fails with SQLSTATE CF001 unless the
// generation is still the owner's. Start takes the same lock exclusively
// in the transaction that raises the generation: it waits for every
// transaction of an earlier sink that passed its fence (committed or
// rolled back, it is final then), and every later one fails. A sink that
// fails its fence is superseded: it writes nothing more (Err reports it).
// The fence also sets cdcflow.writer, transaction-local, to
// "owner/generation": a trigger on a target table can audit which sink
// wrote each row (the cluster's single-writer checker does).
//
// The advisory lock, not a row lock on the owner's row: a row share-locked
// by every lane transaction would write a multixact and WAL per commit; an
// advisory lock lives in the lock table only.

// fenceSQLState is the SQLSTATE cdcflow.fence raises.
const fenceSQLState = "CF001"

// fenceLockClass is the first key of the owners' advisory locks ("cdcf");
// the second is hashtext(owner).
const fenceLockClass = 0x63646366

// schemaSQL creates what the sink keeps in the target, serialised by a
// transaction-level advisory lock: CREATE OR REPLACE FUNCTION of two
// sessions at once fails ("tuple concurrently updated").
var schemaSQL = fmt.Sprintf(`BEGIN;
SELECT pg_advisory_xact_lock(%[1]d, 0);
CREATE SCHEMA IF NOT EXISTS cdcflow;
CREATE TABLE IF NOT EXISTS cdcflow.checkpoints (
  dispatcher text PRIMARY KEY, table_oid bigint NOT NULL, target text NOT NULL, ts bigint NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now(),
  applied_ts bigint NOT NULL DEFAULT 0, applied_index bigint NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS cdcflow.state (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE IF NOT EXISTS cdcflow.owners (
  owner text PRIMARY KEY, generation bigint NOT NULL, started_at timestamptz NOT NULL DEFAULT now(),
  wrote boolean NOT NULL DEFAULT false, source text);
DO $m$ BEGIN
  -- An owners table of a version without the wrote marker: its owners are
  -- taken to have written (the safe side: a new slot then empties the
  -- target first). Only then, so no Start takes the table's lock.
  IF NOT EXISTS (SELECT 1 FROM pg_attribute
                 WHERE attrelid = 'cdcflow.owners'::regclass AND attname = 'wrote' AND NOT attisdropped) THEN
    ALTER TABLE cdcflow.owners ADD COLUMN wrote boolean NOT NULL DEFAULT true;
    ALTER TABLE cdcflow.owners ALTER COLUMN wrote SET DEFAULT false;
  END IF;
  -- The source an owner replicates (Options.Source), of a version that
  -- did not record it: added only then, since an ALTER TABLE waits for
  -- every transaction that read the table (an earlier sink's, which
  -- Start must wait for under its own bound, not here).
  IF NOT EXISTS (SELECT 1 FROM pg_attribute
                 WHERE attrelid = 'cdcflow.owners'::regclass AND attname = 'source' AND NOT attisdropped) THEN
    ALTER TABLE cdcflow.owners ADD COLUMN source text;
  END IF;
  -- A table's last row applied (applied.go): of a version that kept it
  -- for keyless tables only (keyless_ts, keyless_index), renamed; of a
  -- version without it, added. Only then, as above.
  IF EXISTS (SELECT 1 FROM pg_attribute
             WHERE attrelid = 'cdcflow.checkpoints'::regclass AND attname = 'keyless_ts' AND NOT attisdropped) THEN
    ALTER TABLE cdcflow.checkpoints RENAME COLUMN keyless_ts TO applied_ts;
    ALTER TABLE cdcflow.checkpoints RENAME COLUMN keyless_index TO applied_index;
  ELSIF NOT EXISTS (SELECT 1 FROM pg_attribute
                    WHERE attrelid = 'cdcflow.checkpoints'::regclass AND attname = 'applied_ts' AND NOT attisdropped) THEN
    ALTER TABLE cdcflow.checkpoints ADD COLUMN applied_ts bigint NOT NULL DEFAULT 0,
      ADD COLUMN applied_index bigint NOT NULL DEFAULT 0;
  END IF;
END $m$;
CREATE OR REPLACE FUNCTION cdcflow.fence(p_owner text, p_generation bigint) RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
  PERFORM pg_advisory_xact_lock_shared(%[1]d, hashtext(p_owner));
  PERFORM 1 FROM cdcflow.owners WHERE owner = p_owner AND generation = p_generation;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'cdcflow: the sink of owner %% at generation %% was superseded', p_owner, p_generation
      USING ERRCODE = '%[2]s';
  END IF;
  -- The transaction's writer, for triggers that audit it (the cluster's
  -- fault tests check that no older generation commits after a newer).
  PERFORM set_config('cdcflow.writer', p_owner || '/' || p_generation, true);
END $f$;
COMMIT`, fenceLockClass, fenceSQLState)

// fenceSQL is the statement that opens every write transaction.
const fenceSQL = "SELECT cdcflow.fence($1, $2)"

// A new owner's marker starts set if the target holds checkpoints: a
// sink of a version before cdcflow.owners wrote there.
//
// markWroteSQL sets the owner's wrote marker: a sink's first transaction
// that writes the target's tables (rows, a truncate, a DDL) carries it, so
// that the marker is set if and only if some sink of the owner wrote
// there since the last Reset. A changefeed's new slot empties the target
// first only then (Wrote): a target it never wrote to keeps its rows, even
// if an earlier start failed after its Start had raised the generation.
const markWroteSQL = "UPDATE cdcflow.owners SET wrote = true WHERE owner = $1 AND NOT wrote"

// acquireFence raises the owner's generation, waiting (up to wait) for
// the transactions of earlier sinks of the owner that passed their fence,
// and returns the new generation and whether a sink of the owner wrote
// the target's tables before (the wrote marker).
//
// With sole, a target that knows another owner is refused
// (ErrAnotherOwner) before this owner's row is written.
func acquireFence(ctx context.Context, conn *pgx.Conn, owner, source string, wait time.Duration, sole bool) (int64, bool, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, false, err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", wait.Milliseconds())); err != nil {
		return 0, false, err
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("SELECT pg_advisory_xact_lock(%d, hashtext($1))", fenceLockClass), owner); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "55P03" { // lock_not_available
			return 0, false, fmt.Errorf("%w: %w: a transaction of an earlier sink of owner %q is still open in the target after %v "+
				"(its process is gone but its connection is not, or it is still running): %w", ErrConnect, errFenceHeld, owner, wait, err)
		}
		return 0, false, err
	}
	if sole {
		rows, err := tx.Query(ctx, "SELECT owner FROM cdcflow.owners WHERE owner <> $1 ORDER BY owner LIMIT 1", owner)
		if err != nil {
			return 0, false, err
		}
		others, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return 0, false, err
		}
		if len(others) > 0 {
			return 0, false, fmt.Errorf("%w: owner %q is refused: the target's cdcflow schema is owner %q's (to move the target to %q, "+
				"stop %q's sink and delete its row from cdcflow.owners)", ErrAnotherOwner, owner, others[0], owner, others[0])
		}
	}
	if source != "" {
		// Checked under the owner's lock: a start of the same owner from
		// another source (a slot name reused elsewhere) must not take
		// over, reset or resume what this one wrote.
		var bound *string
		err := tx.QueryRow(ctx, "SELECT source FROM cdcflow.owners WHERE owner = $1", owner).Scan(&bound)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return 0, false, err
		}
		if bound != nil && *bound != "" && *bound != source {
			return 0, false, fmt.Errorf("%w: owner %q of this target replicates source %s, not %s", ErrOtherSource, owner, *bound, source)
		}
	}
	var gen int64
	var wrote bool
	if err := tx.QueryRow(ctx, `
INSERT INTO cdcflow.owners (owner, generation, wrote, source) VALUES ($1, 1, EXISTS (SELECT 1 FROM cdcflow.checkpoints), nullif($2, ''))
ON CONFLICT (owner) DO UPDATE SET generation = cdcflow.owners.generation + 1, started_at = now(),
  source = coalesce(cdcflow.owners.source, nullif($2, ''))
RETURNING generation, wrote`, owner, source).Scan(&gen, &wrote); err != nil {
		return 0, false, err
	}
	return gen, wrote, tx.Commit(ctx)
}

// errFenceHeld marks a fence whose wait ended with an earlier sink's
// transaction still open.
var errFenceHeld = errors.New("the fence is held")

// endFenceHolders ends the target backends holding owner's fence (the
// shared lock every write transaction of a sink of the owner takes):
// transactions of earlier sinks of the owner that are still open, whose
// process is frozen or cut off mid-transaction (EndFenceHolders). Their
// transactions roll back: none had committed, and the new sink reads
// their rows again from its checkpoints. Only the owner's own lock's
// holders, and only backends of the same role (or any, for a
// superuser): what pg_terminate_backend allows. It returns the PIDs ended.
func endFenceHolders(ctx context.Context, conn *pgx.Conn, owner string) ([]int32, error) {
	rows, err := conn.Query(ctx, fmt.Sprintf(`
SELECT l.pid, pg_terminate_backend(l.pid, 5000) FROM pg_locks l
WHERE l.locktype = 'advisory' AND l.classid = %d AND l.objid::bigint = (hashtext($1)::bigint & 4294967295) AND l.objsubid = 2
  AND l.mode = 'ShareLock' AND l.granted AND l.pid <> pg_backend_pid() AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		fenceLockClass), owner)
	if err != nil {
		return nil, err
	}
	var ended []int32
	for rows.Next() {
		var pid int32
		var ok bool
		if err := rows.Scan(&pid, &ok); err != nil {
			rows.Close()
			return nil, err
		}
		if ok {
			ended = append(ended, pid)
		}
	}
	rows.Close()
	return ended, rows.Err()
}

// isSuperseded reports whether err is cdcflow.fence's refusal.
func isSuperseded(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == fenceSQLState
}

// fenced runs f in a transaction that passed the fence (State writes and
// Reset: a superseded sink must not record a snapshot as done, nor empty
// tables), then each of after once it committed. Before Start there is no
// generation to pass the fence with: ErrNotStarted (the fence would
// refuse generation 0 and the sink would count itself superseded).
func (s *Sink) fenced(ctx context.Context, f func(tx pgx.Tx) error, after ...func()) error {
	s.mu.Lock()
	started := s.mu.started
	s.mu.Unlock()
	if !started {
		return ErrNotStarted
	}
	conn, release, err := s.adminConn(ctx)
	if err != nil {
		return err
	}
	defer release()
	return s.fencedOn(ctx, conn, f, after...)
}

// fencedOn is fenced on conn (the admin connection, held by the caller).
func (s *Sink) fencedOn(ctx context.Context, conn *pgx.Conn, f func(tx pgx.Tx) error, after ...func()) error {
	if err := s.permit(); err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.Exec(ctx, fenceSQL, s.opts.Owner, s.generation); err != nil {
		return s.fenceErr(err)
	}
	if err := f(tx); err != nil {
		return err
	}
	if err := s.fenceErr(tx.Commit(ctx)); err != nil {
		return err
	}
	for _, a := range after {
		a()
	}
	return nil
}

// fenceErr turns the fence's refusal into ErrSuperseded (and records it).
func (s *Sink) fenceErr(err error) error {
	if err == nil || !isSuperseded(err) {
		return err
	}
	s.supersede()
	return fmt.Errorf("%w: %w", ErrSuperseded, err)
}

// permit asks Options.Permit for the next transaction; a refusal is
// recorded as a supersession (nothing is written any more) and returned
// wrapping ErrNotPermitted.
func (s *Sink) permit() error {
	if s.opts.Permit == nil {
		return nil
	}
	err := s.opts.Permit()
	if err == nil {
		return nil
	}
	s.mu.Lock()
	s.mu.notPermitted = err
	s.mu.Unlock()
	s.supersede()
	return fmt.Errorf("%w: %w", ErrNotPermitted, err)
}

// supersede records that a later sink of the owner started: nothing is
// written any more, every call is accepted and dropped, Err reports it.
func (s *Sink) supersede() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.mu.superseded {
		s.mu.superseded = true
		close(s.supersededCh)
		if s.mu.notPermitted != nil {
			s.log.Error("a write was not permitted: this sink writes nothing more", zap.String("owner", s.opts.Owner),
				zap.Int64("generation", s.generation), zap.Error(s.mu.notPermitted))
			return
		}
		s.log.Error("a later sink of the same owner started on the target: this one writes nothing more",
			zap.String("owner", s.opts.Owner), zap.Int64("generation", s.generation))
	}
}

// Err returns ErrSuperseded once a later sink of the same owner started
// on the target, or ErrNotPermitted once Options.Permit refused a write
// (the embedder should stop), nil before.
func (s *Sink) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.notPermitted != nil {
		return fmt.Errorf("%w (owner %q, generation %d): %w", ErrNotPermitted, s.opts.Owner, s.generation, s.mu.notPermitted)
	}
	if s.mu.superseded {
		return fmt.Errorf("%w (owner %q, generation %d)", ErrSuperseded, s.opts.Owner, s.generation)
	}
	return nil
}

// Superseded is closed once a later sink of the same owner started on the
// target and this one found out (at its next write).
func (s *Sink) Superseded() <-chan struct{} { return s.supersededCh }

// CheckFence asks the target whether this sink is still the latest of its
// owner, without writing: a sink with nothing to write would not find out
// otherwise (serve asks every second, so that a process that a later one
// took over exits). A superseded sink records it (Err, Superseded) and
// gets ErrSuperseded; any other error (the target unreachable) is
// returned as it is.
func (s *Sink) CheckFence(ctx context.Context) error {
	return s.fenced(ctx, func(pgx.Tx) error { return nil })
}

// Owner is a row of the target's cdcflow.owners.
type Owner struct {
	Name       string
	Generation int64
	// Source is the source database's identity key the owner replicates
	// ("" for an owner of a version that did not record it).
	Source    string
	Wrote     bool
	StartedAt time.Time
}

// ReadOwners lists the owners of the target conn is connected to, without
// writing anything (none: no cdcflow.owners there). A start checks them
// before it writes, and status shows them.
func ReadOwners(ctx context.Context, conn *pgx.Conn) ([]Owner, error) {
	var exists, hasSource bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('cdcflow.owners') IS NOT NULL,
  EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('cdcflow.owners') AND attname = 'source' AND NOT attisdropped)`).Scan(&exists, &hasSource); err != nil {
		return nil, err
	}
	if !exists {
		return nil, nil
	}
	source := "''"
	if hasSource {
		source = "coalesce(source, '')"
	}
	rows, err := conn.Query(ctx, "SELECT owner, generation, "+source+", wrote, started_at FROM cdcflow.owners ORDER BY owner")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Owner, error) {
		var o Owner
		err := r.Scan(&o.Name, &o.Generation, &o.Source, &o.Wrote, &o.StartedAt)
		return o, err
	})
}

// FenceOut fences out every sink of owner in the target conn is connected
// to, without starting one: it raises the owner's generation under the
// owner's lock, waiting (up to wait) for their transactions that passed
// the fence; each of them fails its next fence and stops as superseded
// (removing a changefeed whose serve still runs). No owners table, or no
// row of owner: nothing to fence.
func FenceOut(ctx context.Context, conn *pgx.Conn, owner string, wait time.Duration) error {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass('cdcflow.owners') IS NOT NULL").Scan(&exists); err != nil || !exists {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", wait.Milliseconds())); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("SELECT pg_advisory_xact_lock(%d, hashtext($1))", fenceLockClass), owner); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "UPDATE cdcflow.owners SET generation = generation + 1 WHERE owner = $1", owner); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
