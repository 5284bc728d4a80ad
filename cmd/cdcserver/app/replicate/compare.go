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
// order-independent checksum (the sum of a hash of each row's text: what
// the changefeed writes of it, the published columns and the generated
// ones the target computes, pgsource.TableInfo.Columns), of the source's
// rows the publication's row filter keeps. It writes one line per table
// and returns ErrDiffer naming the first that differs.
func Compare(ctx context.Context, source, sink, publication string, out io.Writer) error {
	return CompareRows(ctx, source, sink, publication, 0, out)
}

// CompareRows is Compare that also names, under each table that differs,
// up to rows of its rows that do (diffRows): the first keys, in the
// key's text order, or for a table without a key the rows one side holds
// more copies of.
func CompareRows(ctx context.Context, source, sink, publication string, rows int, out io.Writer) error {
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
	// The publication's tables and its companion's of inserts (the tool's
	// own state is never published). A table the changefeed leaves out
	// is not compared: the target lacking it proves nothing wrong.
	infos, err := pgsource.ListTables(ctx, src, publication)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	var tables []pgsource.TableInfo
	for _, i := range infos {
		if i.Err != nil {
			fmt.Fprintf(out, "%-40s left out of the changefeed (%v): not compared\n", i.Name, i.Err)
			continue
		}
		tables = append(tables, i)
	}
	if len(tables) == 0 {
		// Nothing compared is not "equal".
		return fmt.Errorf("%w: publication %q has no tables the changefeed replicates (or does not exist)", ErrSetup, publication)
	}
	var first error
	for _, i := range tables {
		t := i.Name
		cols := make([]string, len(i.Columns))
		for k, c := range i.Columns {
			cols[k] = "t." + pgcodec.QuoteIdent(c)
		}
		// The source's rows the publication's row filter keeps, the
		// target's all.
		// Both sides at once: each is a scan of the whole table.
		var b TableSum
		var errB error
		done := make(chan struct{})
		go func() {
			defer close(done)
			b, errB = tableSum(ctx, dst, t, cols, "")
		}()
		a, err := tableSum(ctx, src, t, cols, i.RowFilter)
		<-done
		if err != nil {
			return fmt.Errorf("source %s: %w", t, err)
		}
		if errB != nil {
			b = TableSum{Table: t, Rows: -1, Sum: errB.Error()}
		}
		verdict := "equal"
		if a != b {
			verdict = "DIFFERENT"
			if i.Identity == pgcodec.IdentityNone {
				verdict += " (no key or REPLICA IDENTITY FULL: only its inserts are replicated)"
			}
			if first == nil {
				first = fmt.Errorf("%w: %s: source %d rows (sum %s), target %d rows (sum %s)", ErrDiffer, t, a.Rows, a.Sum, b.Rows, b.Sum)
			}
		}
		fmt.Fprintf(out, "%-40s rows %10d / %10d  %s\n", t, a.Rows, b.Rows, verdict)
		if a != b && rows > 0 && b.Rows >= 0 {
			if err := diffRows(ctx, src, dst, i, rows, out); err != nil {
				return err
			}
		}
	}
	return first
}

// tableSum counts the table's rows and sums a 64-bit hash of the text of
// each one's cols (the session's text formats fixed, pgcodec's, so both
// sides print alike whatever their servers' settings; a value of a created
// type the target stores as its base type prints the same text).
func tableSum(ctx context.Context, conn *pgx.Conn, table string, cols []string, filter string) (TableSum, error) {
	for k, v := range pgcodec.TextFormatParams() {
		if _, err := conn.Exec(ctx, "SELECT set_config($1, $2, false)", k, v); err != nil {
			return TableSum{}, err
		}
	}
	s := TableSum{Table: table}
	where := ""
	if filter != "" {
		where = " WHERE " + filter
	}
	err := conn.QueryRow(ctx, "SELECT count(*), coalesce(sum(('x' || substr(md5(ROW("+strings.Join(cols, ", ")+
		")::text), 1, 16))::bit(64)::bigint::numeric), 0)::text FROM "+table+" t"+where).Scan(&s.Rows, &s.Sum)
	return s, err
}
