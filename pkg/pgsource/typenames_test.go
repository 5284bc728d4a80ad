package pgsource

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// Every type name a real server writes (format_type, which the catalog
// reads) passes the sink's check of what may be pasted into SQL: the
// check refuses what is not a type name without refusing a type that is,
// with or without its modifier, in an array, in a schema or quoted.
func TestEveryTypeNameTheServerWritesIsValid(t *testing.T) {
	pg := pgtest.Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pg.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `CREATE SCHEMA "Sales";
CREATE TYPE "Sales".mood AS ENUM ('ok');
CREATE DOMAIN "we""ird type" AS int;
CREATE TABLE typmods (a varchar(20), b numeric(10,2), c numeric(5,-2), d timestamp(3) with time zone,
  e time(6), f interval day to second(3), g interval year to month, h bit varying(5), i char(3), j "char",
  k text[], l int[][], m "Sales".mood[], n "we""ird type", o timestamptz[], p float8, q varbit, r interval(2))`)
	require.NoError(t, err)
	rows, err := conn.Query(ctx, `SELECT format_type(t.oid, NULL) FROM pg_type t WHERE t.typtype <> 'p'
UNION SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'typmods'::regclass AND attnum > 0`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Greater(t, len(names), 100)
	require.Contains(t, names, "interval day to second(3)")
	require.Contains(t, names, `"Sales".mood[]`)
	for _, n := range names {
		r := pgcodec.Relation{Schema: "s", Name: "t", Columns: []pgcodec.Column{{Name: "id", Type: n, Key: true}}}
		require.NoError(t, r.Validate(), "the server's type name %q", n)
	}
}
