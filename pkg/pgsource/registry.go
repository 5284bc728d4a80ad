package pgsource

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcflow/eventservice/internal/pglink"
)

// The changefeeds of a source are registered in the source database
// itself, in cdcflow.changefeeds: the slot a changefeed streams, the
// target database it writes to (by identity), and whether it created the
// publication. A starting changefeed reads it before it touches a slot or
// a publication: a slot registered for another target is never used,
// taken over or dropped (a second serve that forgot --slot dropped the
// first one's slot, ending it), and one found unregistered was not made by
// a changefeed that registered it. The registry is the slot's owner record
// because a slot cannot carry one, and it lives where the slot does (a
// target cannot tell a second target's changefeed about a slot).
//
// ToolSchema is never replicated: its tables are left out of every
// publication a changefeed reads (a FOR ALL TABLES one publishes them).

// ToolSchema is the schema the changefeed keeps its own state in, on the
// source (the registry) and on the target (checkpoints, positions).
const ToolSchema = "cdcflow"

// ErrNotOwner: the slot belongs to another changefeed (registered for
// another target), or exists without having been registered.
var ErrNotOwner = errors.New("pgsource: the slot is not this changefeed's")

// ErrCorruptRegistry: the registry holds a row that does not read (a
// target identity that is not one).
var ErrCorruptRegistry = errors.New("pgsource: corrupt changefeed registry")

// registrySQL creates the registry, serialised like the sink's schema (a
// transaction-level advisory lock: two CREATEs at once can fail).
const registrySQL = `BEGIN;
SELECT pg_advisory_xact_lock(1667523430, 1);
CREATE SCHEMA IF NOT EXISTS cdcflow;
CREATE TABLE IF NOT EXISTS cdcflow.changefeeds (
  slot text PRIMARY KEY,
  target_system_id text NOT NULL,
  target_database_oid bigint NOT NULL,
  target text NOT NULL,
  publication text NOT NULL,
  created_publication boolean NOT NULL DEFAULT false,
  registered_at timestamptz NOT NULL DEFAULT now());
COMMIT`

// Registration is the registry's row of one changefeed.
type Registration struct {
	Slot string
	// TargetID identifies the target database; Target describes it
	// (host:port/database, as the registering process reached it).
	TargetID    pglink.Identity
	Target      string
	Publication string
	// CreatedPublication: the changefeed created the publication (and
	// removing the changefeed drops it).
	CreatedPublication bool
	RegisteredAt       time.Time
}

// Connect opens a regular connection to the source (text formats as the
// source's own, keepalives as every connection of the source).
func Connect(ctx context.Context, dsn string) (*pgx.Conn, error) { return connect(ctx, dsn) }

// LoadRegistration reads the slot's row of the registry (false: none, or
// no registry).
func LoadRegistration(ctx context.Context, conn *pgx.Conn, slot string) (Registration, bool, error) {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass('cdcflow.changefeeds') IS NOT NULL").Scan(&exists); err != nil || !exists {
		return Registration{}, false, err
	}
	var r Registration
	var sys string
	var dboid int64
	err := conn.QueryRow(ctx, `SELECT slot, target_system_id, target_database_oid, target, publication, created_publication, registered_at
FROM cdcflow.changefeeds WHERE slot = $1`, slot).Scan(&r.Slot, &sys, &dboid, &r.Target, &r.Publication, &r.CreatedPublication, &r.RegisteredAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Registration{}, false, nil
	}
	if err != nil {
		return Registration{}, false, fmt.Errorf("pgsource: read the registry: %w", err)
	}
	id, ok := pglink.ParseKey(fmt.Sprintf("%s/%d", sys, dboid))
	if !ok {
		return Registration{}, false, fmt.Errorf("%w: the registry's row of slot %s names target %q/%d", ErrCorruptRegistry, slot, sys, dboid)
	}
	r.TargetID = id
	return r, true, nil
}

// Register records r unless the slot is registered already, and returns
// the row the registry holds then: r, or the earlier one (two changefeeds
// starting at once: one wins, and the other finds the winner's target).
func Register(ctx context.Context, conn *pgx.Conn, r Registration) (Registration, error) {
	if _, err := conn.Exec(ctx, registrySQL); err != nil {
		return Registration{}, fmt.Errorf("pgsource: create the registry (schema %s on the source): %w", ToolSchema, err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO cdcflow.changefeeds (slot, target_system_id, target_database_oid, target, publication, created_publication)
VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (slot) DO NOTHING`,
		r.Slot, fmt.Sprint(r.TargetID.SystemID), int64(r.TargetID.DatabaseOID), r.Target, r.Publication, r.CreatedPublication); err != nil {
		return Registration{}, fmt.Errorf("pgsource: register the changefeed: %w", err)
	}
	got, ok, err := LoadRegistration(ctx, conn, r.Slot)
	if err == nil && !ok {
		err = fmt.Errorf("pgsource: the registry lost slot %s's row", r.Slot)
	}
	return got, err
}

// Unregister deletes the slot's row, and the registry (and the schema,
// if nothing else is left in it) once no changefeed is registered.
func Unregister(ctx context.Context, conn *pgx.Conn, slot string) error {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass('cdcflow.changefeeds') IS NOT NULL").Scan(&exists); err != nil || !exists {
		return err
	}
	if _, err := conn.Exec(ctx, "DELETE FROM cdcflow.changefeeds WHERE slot = $1", slot); err != nil {
		return fmt.Errorf("pgsource: unregister: %w", err)
	}
	_, err := conn.Exec(ctx, `DO $u$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM cdcflow.changefeeds) THEN
    DROP TABLE cdcflow.changefeeds;
    IF NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'cdcflow')
       AND NOT EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'cdcflow') THEN
      DROP SCHEMA cdcflow;
    END IF;
  END IF;
END $u$`)
	if err != nil {
		return fmt.Errorf("pgsource: unregister: %w", err)
	}
	return nil
}
