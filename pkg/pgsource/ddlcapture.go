package pgsource

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/pgcodec"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// DDL capture. pgoutput's relation messages describe a table's columns by
// name, in order, and nothing more: they cannot tell a column renamed from
// one dropped and another added (nor a column dropped and added again
// under its name), which a sink must carry differently (a rename keeps
// the values). So where the role may (a superuser: event triggers need
// one), Open installs an event trigger on the source that, at the end of
// every CREATE or ALTER TABLE, writes a transactional logical message in
// the DDL's own transaction with the table's columns and their numbers
// (attnum, which a rename keeps and a drop and an add change). The stream
// meets it in order, before any row of the new shape; the core keeps the
// last one per table (streamState.captured), and a relation version the
// session describes afterwards carries the numbers (pgcodec.Column.Num),
// by which the sink tells the cases apart (pkg/pgsink/evolve.go). An
// ALTER TABLE whose statement may convert a column by an expression of
// its own (its text has USING, or is no visible ALTER: a function that
// runs one) carries the statement (Relation.UnknownConversion), and the
// sink stops a table retyped so rather than convert it by a cast.
//
// The trigger must never hold up or fail a source's DDL: it is SECURITY
// DEFINER (the installer's right to write the message, whoever runs the
// DDL), with a fixed search_path, and any error of its own is a warning,
// not the DDL's failure. One trigger serves every changefeed of the
// database; the last one's remove drops it. Without it (a role that is
// not a superuser), relation versions carry the numbers the catalog gave
// at Open and keep them by name, and the sink's rules by place apply.

// ddlPrefix marks the capture's messages.
const ddlPrefix = "cdcflow-ddl"

// maxStatementChars bounds the statement a capture message carries (an
// ALTER whose conversion is not known: a migration script can be large).
const maxStatementChars = "1000"

// captureLock serialises the capture's installs under the registry's
// advisory lock: the changefeeds of one source starting at once each
// install it, and two CREATE OR REPLACE FUNCTIONs at once fail ("tuple
// concurrently updated", a duplicate key of pg_proc).
const captureLock = "SELECT pg_advisory_xact_lock(1667523430, 1);"

// captureSQL installs the capture (idempotent), in one transaction under
// captureLock.
const captureSQL = `BEGIN;
` + captureLock + `
CREATE SCHEMA IF NOT EXISTS cdcflow;
CREATE OR REPLACE FUNCTION cdcflow.capture_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $f$
DECLARE r record;
BEGIN
  FOR r IN SELECT DISTINCT c.oid FROM pg_event_trigger_ddl_commands() d JOIN pg_class c ON c.oid = d.objid
           WHERE d.classid = 'pg_class'::regclass AND c.relkind IN ('r', 'p') LOOP
    BEGIN
      PERFORM pg_logical_emit_message(true, '` + ddlPrefix + `', json_build_object('oid', r.oid::bigint, 'columns',
        (SELECT coalesce(json_agg(json_build_object('num', a.attnum, 'name', a.attname) ORDER BY a.attnum), '[]'::json)
         FROM pg_attribute a WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''),
        'generated',
        (SELECT coalesce(json_agg(json_build_object('name', a.attname, 'type', format_type(a.atttypid, a.atttypmod),
                                                    'expr', pg_get_expr(d.adbin, d.adrelid)) ORDER BY a.attnum), '[]'::json)
         FROM pg_attribute a JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = 's'),
        'unknown_conversion',
        CASE WHEN tg_tag = 'ALTER TABLE' AND (current_query() ~* '\musing\M' OR current_query() !~* '\malter\M') THEN left(current_query(), ` + maxStatementChars + `) END)::text);
    EXCEPTION WHEN OTHERS THEN
      RAISE WARNING 'cdcflow: capturing a DDL of table % failed: %', r.oid, SQLERRM;
    END;
  END LOOP;
END $f$;
CREATE OR REPLACE FUNCTION cdcflow.capture_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $f$
DECLARE r record;
BEGIN
  FOR r IN SELECT objid FROM pg_event_trigger_dropped_objects()
           WHERE classid = 'pg_class'::regclass AND objsubid = 0 AND object_type = 'table' AND NOT is_temporary LOOP
    BEGIN
      PERFORM pg_logical_emit_message(true, '` + ddlPrefix + `', json_build_object('oid', r.objid::bigint, 'dropped', true)::text);
    EXCEPTION WHEN OTHERS THEN
      RAISE WARNING 'cdcflow: capturing the drop of table % failed: %', r.objid, SQLERRM;
    END;
  END LOOP;
END $f$;
DO $d$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'cdcflow_capture_ddl') THEN
    CREATE EVENT TRIGGER cdcflow_capture_ddl ON ddl_command_end WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE')
      EXECUTE FUNCTION cdcflow.capture_ddl();
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'cdcflow_capture_drop') THEN
    CREATE EVENT TRIGGER cdcflow_capture_drop ON sql_drop WHEN TAG IN ('DROP TABLE')
      EXECUTE FUNCTION cdcflow.capture_drop();
  END IF;
END $d$;
COMMIT`

// installCapture installs the DDL capture if the role is a superuser, and
// reports whether the capture is there.
func (s *Source) installCapture(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var super, there bool
	if err := conn.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil {
		return false, err
	}
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'cdcflow_capture_ddl' AND evtenabled <> 'D')`).Scan(&there); err != nil {
		return false, err
	}
	if !super || s.opts.NoDDLCapture {
		if !there {
			why := "its event trigger needs a superuser"
			if s.opts.NoDDLCapture {
				why = "NoDDLCapture"
			}
			s.log.Info("no DDL capture on the source: a renamed last column, or a column dropped and added again under its name, "+
				"cannot be told apart from other changes, and a dropped table's target table stays; such a change stops its table",
				zap.String("why", why))
		}
		return there, nil
	}
	if _, err := conn.Exec(ctx, captureSQL); err != nil {
		return false, fmt.Errorf("pgsource: install the DDL capture: %w", err)
	}
	return true, nil
}

// DropCaptureSQL drops the DDL capture if the role may (its owner's or a
// superuser's); remove runs it with the registry's last row.
const DropCaptureSQL = `DO $c$ BEGIN
  IF EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'cdcflow_capture_ddl' AND pg_has_role(evtowner, 'USAGE')) THEN
    DROP EVENT TRIGGER cdcflow_capture_ddl;
  END IF;
  IF EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'cdcflow_capture_drop' AND pg_has_role(evtowner, 'USAGE')) THEN
    DROP EVENT TRIGGER cdcflow_capture_drop;
  END IF;
  IF EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'cdcflow' AND p.proname = 'capture_ddl' AND pg_has_role(p.proowner, 'USAGE')) THEN
    DROP FUNCTION cdcflow.capture_ddl();
  END IF;
  IF EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'cdcflow' AND p.proname = 'capture_drop' AND pg_has_role(p.proowner, 'USAGE')) THEN
    DROP FUNCTION cdcflow.capture_drop();
  END IF;
END $c$`

// capturedTable is a capture message: a table's columns and numbers, or
// that it was dropped.
type capturedTable struct {
	OID       uint32                    `json:"oid"`
	Dropped   bool                      `json:"dropped"`
	Generated []pgcodec.GeneratedColumn `json:"generated"`
	// UnknownConversion is the statement when a type it changed may have
	// been converted by an expression of its own (pgcodec.Relation's).
	UnknownConversion string `json:"unknown_conversion"`
	Columns           []struct {
		Num  int16  `json:"num"`
		Name string `json:"name"`
	} `json:"columns"`
}

// maxCaptureBytes bounds a capture message (1600 columns of 63-byte names
// fit well within it).
const maxCaptureBytes = 1 << 20

// parseCapture reads a capture message: hostile until validated. A drop
// has no numbers (shape.nums nil). The generated columns are validated
// where they become a relation version (pgcodec.Relation.Validate, at the
// sink).
func parseCapture(content []byte) (uint32, capturedShape, error) {
	if len(content) > maxCaptureBytes {
		return 0, capturedShape{}, fmt.Errorf("%w: a DDL capture of %d bytes", ErrProtocol, len(content))
	}
	var t capturedTable
	if err := json.Unmarshal(content, &t); err != nil {
		return 0, capturedShape{}, fmt.Errorf("%w: a DDL capture: %w", ErrProtocol, err)
	}
	if t.OID == 0 {
		return 0, capturedShape{}, fmt.Errorf("%w: a DDL capture without a table", ErrProtocol)
	}
	if t.Dropped {
		return t.OID, capturedShape{}, nil
	}
	if !utf8.ValidString(t.UnknownConversion) {
		return 0, capturedShape{}, fmt.Errorf("%w: a DDL capture's statement is not UTF-8", ErrProtocol)
	}
	nums := make(map[string]int16, len(t.Columns))
	for _, c := range t.Columns {
		if c.Num <= 0 || c.Name == "" || !utf8.ValidString(c.Name) {
			return 0, capturedShape{}, fmt.Errorf("%w: a DDL capture's column %q numbered %d", ErrProtocol, c.Name, c.Num)
		}
		nums[c.Name] = c.Num
	}
	return t.OID, capturedShape{nums: nums, generated: t.Generated, unknownConversion: t.UnknownConversion}, nil
}

// capture records a capture message of the transaction being decoded. A
// message it cannot read is counted and dropped: the numbers are a help,
// never needed for a row.
func (c *core) capture(content []byte) {
	oid, shape, err := parseCapture(content)
	nums, gens := shape.nums, shape.generated
	if err != nil {
		c.tally.badCaptures++
		return
	}
	if nums == nil {
		// Dropped: a subscribed table's target table goes too, after its
		// last rows (a DDL of its own at the drop's commit-ts minus one).
		delete(c.st.captured, oid)
		if len(c.subs[oid]) > 0 {
			c.emit(action{kind: actDDL, ddl: schemastore.DDL{TableID: int64(oid), CommitTs: c.cur.ts - 1, Query: pgcodec.DropTableDDL(oid)}})
			c.tally.ddls++
		}
		return
	}
	if c.st.captured == nil {
		c.st.captured = map[uint32]capturedShape{}
	}
	c.st.captured[oid] = shape
	if known, ok := c.st.known[oid]; ok && len(c.subs[oid]) > 0 && len(nums) == len(known.Columns) && !slices.Equal(known.Generated, gens) {
		// A stored generated column added or dropped changes no relation
		// message (PostgreSQL 15 publishes none): the capture is its DDL
		// (but under a column list, which leaves generated columns out:
		// their expressions may read a column it drops).
		rel := known
		rel.Generated = gens
		c.adopt(rel)
	}
}

// capturedShape is a table's last DDL capture: its columns' numbers by
// name, its stored generated columns, and the statement if it may have
// converted a column by an expression of its own.
type capturedShape struct {
	nums              map[string]int16
	generated         []pgcodec.GeneratedColumn
	unknownConversion string
}

// captured returns table oid's last DDL capture (ok false: none).
func (c *core) captured(oid uint32) (capturedShape, bool) {
	shape, ok := c.st.captured[oid]
	return shape, ok
}
