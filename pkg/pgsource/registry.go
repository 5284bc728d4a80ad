package pgsource

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
ALTER TABLE cdcflow.changefeeds ADD COLUMN IF NOT EXISTS include text NOT NULL DEFAULT '';
ALTER TABLE cdcflow.changefeeds ADD COLUMN IF NOT EXISTS exclude text NOT NULL DEFAULT '';
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
	// Tables is the rule of the publication it manages (its last start's
	// --include and --exclude).
	Tables TableRule
}

// splitPatterns reads a comma-separated list of patterns.
func splitPatterns(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
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
	var sys, include, exclude string
	var dboid int64
	var hasRule bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'cdcflow.changefeeds'::regclass
  AND attname = 'include' AND NOT attisdropped)`).Scan(&hasRule); err != nil {
		return Registration{}, false, fmt.Errorf("pgsource: read the registry: %w", err)
	}
	rule := "'', ''"
	if hasRule {
		rule = "include, exclude"
	}
	err := conn.QueryRow(ctx, `SELECT slot, target_system_id, target_database_oid, target, publication, created_publication, registered_at, `+rule+`
FROM cdcflow.changefeeds WHERE slot = $1`, slot).Scan(&r.Slot, &sys, &dboid, &r.Target, &r.Publication, &r.CreatedPublication, &r.RegisteredAt,
		&include, &exclude)
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
	r.Tables = TableRule{Include: splitPatterns(include), Exclude: splitPatterns(exclude)}
	return r, true, nil
}

// Register records r unless the slot is registered already, and returns
// the row the registry holds then: r, or the earlier one (two changefeeds
// starting at once: one wins, and the other finds the winner's target).
func Register(ctx context.Context, conn *pgx.Conn, r Registration) (Registration, error) {
	if _, err := conn.Exec(ctx, registrySQL); err != nil {
		return Registration{}, fmt.Errorf("pgsource: create the registry (schema %s on the source): %w", ToolSchema, err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO cdcflow.changefeeds (slot, target_system_id, target_database_oid, target, publication, created_publication, include, exclude)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (slot) DO NOTHING`,
		r.Slot, fmt.Sprint(r.TargetID.SystemID), int64(r.TargetID.DatabaseOID), r.Target, r.Publication, r.CreatedPublication,
		strings.Join(r.Tables.Include, ","), strings.Join(r.Tables.Exclude, ",")); err != nil {
		return Registration{}, fmt.Errorf("pgsource: register the changefeed: %w", err)
	}
	got, ok, err := LoadRegistration(ctx, conn, r.Slot)
	if err == nil && !ok {
		err = fmt.Errorf("pgsource: the registry lost slot %s's row", r.Slot)
	}
	return got, err
}

// SetTableRule records the rule of the publication a registered
// changefeed manages (a start's --include and --exclude), for status.
func SetTableRule(ctx context.Context, conn *pgx.Conn, slot string, rule TableRule) error {
	if _, err := conn.Exec(ctx, registrySQL); err != nil {
		return fmt.Errorf("pgsource: the registry: %w", err)
	}
	_, err := conn.Exec(ctx, "UPDATE cdcflow.changefeeds SET include = $2, exclude = $3 WHERE slot = $1",
		slot, strings.Join(rule.Include, ","), strings.Join(rule.Exclude, ","))
	return err
}

// LeftOutTables lists the tables a changefeed does not replicate, with
// why: of a publication it manages, those its rule leaves out; of any, the
// published tables a sink cannot describe.
func LeftOutTables(ctx context.Context, conn *pgx.Conn, pub string, managed bool, rule TableRule) ([]LeftOut, error) {
	var out []LeftOut
	if managed {
		cands, err := candidates(ctx, conn)
		if err != nil {
			return nil, err
		}
		_, _, out = selectTables(cands, rule)
	}
	pubs, err := publicationsOf(ctx, conn, pub)
	if err != nil {
		return nil, err
	}
	tables, err := publishedTables(ctx, conn, pubs)
	if err != nil {
		return nil, err
	}
	for _, t := range tables {
		if t.relationErr != nil {
			out = append(out, LeftOut{Table: t.schema + "." + t.name, Reason: t.relationErr.Error()})
		}
	}
	return out, nil
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
	var last bool
	if err := conn.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM cdcflow.changefeeds)").Scan(&last); err != nil {
		return fmt.Errorf("pgsource: unregister: %w", err)
	}
	if last {
		if _, err := conn.Exec(ctx, DropCaptureSQL); err != nil {
			return fmt.Errorf("pgsource: unregister: drop the DDL capture: %w", err)
		}
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
