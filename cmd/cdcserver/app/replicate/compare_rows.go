package replicate

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cdcflow/eventservice/pkg/pgcodec"
	"github.com/cdcflow/eventservice/pkg/pgsource"
)

// diffRows names up to limit rows of table t that differ between the
// source (its rows the row filter keeps) and the target: for a table with
// a key, the keys whose rows differ or that one side lacks; for one
// without, the rows one side holds more copies of. Both sides are read in
// one order, the key's text (or the row's hash) under COLLATE "C" (bytes,
// whatever either server's collation), and merged as they stream: memory
// does not grow with the table.
func diffRows(ctx context.Context, src, dst *pgx.Conn, t pgsource.TableInfo, limit int, out io.Writer) error {
	cols := make([]string, len(t.Columns))
	for k, c := range t.Columns {
		cols[k] = "t." + pgcodec.QuoteIdent(c)
	}
	row := "ROW(" + strings.Join(cols, ", ") + ")::text"
	var q string
	if len(t.Key) > 0 {
		keys := make([]string, len(t.Key))
		for k, c := range t.Key {
			keys[k] = "t." + pgcodec.QuoteIdent(c) + "::text"
		}
		// The key's text (ROW of the parts: a NULL-free, unambiguous
		// rendering), the row's hash, and the row's text to show.
		key := "ROW(" + strings.Join(keys, ", ") + ")::text"
		q = "SELECT " + key + " COLLATE \"C\" AS k, md5(" + row + "), 1 FROM " + t.Name + " t%s ORDER BY 1"
	} else {
		q = "SELECT md5(" + row + ") COLLATE \"C\" AS k, min(" + row + "), count(*) FROM " + t.Name + " t%s GROUP BY 1 ORDER BY 1"
	}
	where := ""
	if t.RowFilter != "" {
		where = " WHERE " + t.RowFilter
	}
	a, err := src.Query(ctx, fmt.Sprintf(q, where))
	if err != nil {
		return fmt.Errorf("source %s: %w", t.Name, err)
	}
	defer a.Close()
	b, err := dst.Query(ctx, fmt.Sprintf(q, ""))
	if err != nil {
		return fmt.Errorf("target %s: %w", t.Name, err)
	}
	defer b.Close()
	type entry struct {
		key, val string
		n        int64
		ok       bool
	}
	next := func(r pgx.Rows) (entry, error) {
		if !r.Next() {
			return entry{}, r.Err()
		}
		var e entry
		err := r.Scan(&e.key, &e.val, &e.n)
		e.ok = err == nil
		return e, err
	}
	x, err := next(a)
	if err != nil {
		return err
	}
	y, err := next(b)
	if err != nil {
		return err
	}
	named := 0
	say := func(format string, args ...any) {
		fmt.Fprintf(out, "  "+format+"\n", args...)
		named++
	}
	for (x.ok || y.ok) && named < limit {
		switch {
		case y.ok && (!x.ok || y.key < x.key):
			if len(t.Key) > 0 {
				say("key %s: only in the target", y.key)
			} else {
				say("row %s: %d more in the target", y.val, y.n)
			}
			if y, err = next(b); err != nil {
				return err
			}
			continue
		case x.ok && (!y.ok || x.key < y.key):
			if len(t.Key) > 0 {
				say("key %s: missing in the target", x.key)
			} else {
				say("row %s: %d missing in the target", x.val, x.n)
			}
		case len(t.Key) > 0 && x.val != y.val:
			say("key %s: the row differs", x.key)
		case len(t.Key) == 0 && x.n != y.n:
			say("row %s: %d in the source, %d in the target", x.val, x.n, y.n)
		}
		if x.ok && y.ok && x.key == y.key {
			if y, err = next(b); err != nil {
				return err
			}
		}
		if x, err = next(a); err != nil {
			return err
		}
	}
	return nil
}
