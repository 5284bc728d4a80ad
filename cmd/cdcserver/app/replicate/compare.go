package replicate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cdcflow/eventservice/pkg/pgcodec"
	"github.com/cdcflow/eventservice/pkg/pgsource"
)

// ErrDiffer: compare found a table that differs.
var ErrDiffer = errors.New("tables differ")

// TableSum is one table's row count and order-independent checksum.
type TableSum struct {
	Table string
	Rows  int64
	Sum   string // the sum of a 64-bit hash of each row's text, as a decimal
}

// Compare checks that every table of the source's publication holds the
// same rows in the target: per table the row count and an
// order-independent checksum (the sum of a hash of each row's text, the
// row's replicated columns in order: generated ones are not published). It
// writes one line per table and returns ErrDiffer naming the first that
// differs.
func Compare(ctx context.Context, source, sink, publication string, out io.Writer) error {
	src, err := pgx.Connect(ctx, source)
	if err != nil {
		return fmt.Errorf("%w: source: %w", ErrSetup, err)
	}
	defer src.Close(context.Background())
	dst, err := pgx.Connect(ctx, sink)
	if err != nil {
		return fmt.Errorf("%w: sink: %w", ErrSetup, err)
	}
	defer dst.Close(context.Background())
	tables, err := publishedTables(ctx, src, publication)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	// A table the changefeed leaves out (no key) is not compared: the
	// target lacking it proves nothing wrong.
	infos, err := pgsource.ListTables(ctx, src, publication)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	left := map[string]bool{}
	for _, i := range infos {
		if i.Err != nil {
			left[i.Name] = true
		}
	}
	kept := tables[:0]
	for _, t := range tables {
		if left[t] {
			fmt.Fprintf(out, "%-40s left out of the changefeed (no key): not compared\n", t)
			continue
		}
		kept = append(kept, t)
	}
	tables = kept
	if len(tables) == 0 {
		// Nothing compared is not "equal".
		return fmt.Errorf("%w: publication %q has no tables the changefeed replicates (or does not exist)", ErrSetup, publication)
	}
	var first error
	for _, t := range tables {
		cols, err := replicatedColumns(ctx, src, t)
		if err != nil {
			return fmt.Errorf("source %s: %w", t, err)
		}
		a, err := tableSum(ctx, src, t, cols)
		if err != nil {
			return fmt.Errorf("source %s: %w", t, err)
		}
		b, err := tableSum(ctx, dst, t, cols)
		if err != nil {
			b = TableSum{Table: t, Rows: -1, Sum: err.Error()}
		}
		verdict := "equal"
		if a != b {
			verdict = "DIFFERENT"
			if first == nil {
				first = fmt.Errorf("%w: %s: source %d rows (sum %s), target %d rows (sum %s)", ErrDiffer, t, a.Rows, a.Sum, b.Rows, b.Sum)
			}
		}
		fmt.Fprintf(out, "%-40s rows %10d / %10d  %s\n", t, a.Rows, b.Rows, verdict)
	}
	return first
}

// publishedTables lists the publication's tables, quoted, in name order.
func publishedTables(ctx context.Context, conn *pgx.Conn, pub string) ([]string, error) {
	rows, err := conn.Query(ctx, "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = $1 AND schemaname <> $2 ORDER BY 1, 2",
		pub, pgsource.ToolSchema) // the tool's own state is never replicated
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s, n string
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		out = append(out, pgcodec.QuoteIdent(s)+"."+pgcodec.QuoteIdent(n))
	}
	return out, rows.Err()
}

// replicatedColumns lists the source table's columns that are
// replicated, quoted, in order: not the generated ones, which PostgreSQL
// does not publish (the target computes or lacks them).
func replicatedColumns(ctx context.Context, conn *pgx.Conn, table string) ([]string, error) {
	rows, err := conn.Query(ctx, `SELECT attname FROM pg_attribute
WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum`, table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return nil, err
		}
		cols = append(cols, "t."+pgcodec.QuoteIdent(c))
	}
	return cols, rows.Err()
}

// tableSum counts the table's rows and sums a 64-bit hash of the text of
// each one's cols (the session's text formats fixed, pgcodec's, so both
// sides print alike whatever their servers' settings; a value of a created
// type the target stores as its base type prints the same text).
func tableSum(ctx context.Context, conn *pgx.Conn, table string, cols []string) (TableSum, error) {
	for k, v := range pgcodec.TextFormatParams() {
		if _, err := conn.Exec(ctx, "SELECT set_config($1, $2, false)", k, v); err != nil {
			return TableSum{}, err
		}
	}
	s := TableSum{Table: table}
	err := conn.QueryRow(ctx, "SELECT count(*), coalesce(sum(('x' || substr(md5(ROW("+strings.Join(cols, ", ")+
		")::text), 1, 16))::bit(64)::bigint::numeric), 0)::text FROM "+table+" t").Scan(&s.Rows, &s.Sum)
	return s, err
}
