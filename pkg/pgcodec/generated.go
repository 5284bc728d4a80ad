package pgcodec

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// GeneratedColumn is a stored generated column of a relation (GENERATED
// ALWAYS AS (Expr) STORED). PostgreSQL 15 does not publish their values,
// so a relation's Columns never hold one: a sink creates it with the
// source's expression, read from the source's catalog (pg_get_expr), and
// the target computes it.
type GeneratedColumn struct {
	Name string `json:"name"`
	Type string `json:"type"` // as format_type writes it
	Expr string `json:"expr"`
}

// maxExprBytes bounds a generated column's expression.
const maxExprBytes = 64 << 10

// checkExpr checks that e is one SQL expression that cannot end the
// clause it is written in: its parentheses balance, and outside string
// constants and quoted identifiers it holds no semicolon and no comment.
// pg_get_expr writes nothing else, but the text crossed the event store
// and is spliced into a target's CREATE TABLE.
func checkExpr(e string) error {
	if e == "" || len(e) > maxExprBytes || !utf8.ValidString(e) || strings.IndexByte(e, 0) >= 0 {
		return errors.New("not an expression of valid UTF-8 without NUL")
	}
	depth := 0
	for i := 0; i < len(e); i++ {
		switch c := e[i]; c {
		case '\'', '"':
			// A string constant (E'...' escapes a quote with a
			// backslash) or a quoted identifier; a doubled quote is one.
			escapes := c == '\'' && i > 0 && (e[i-1] == 'E' || e[i-1] == 'e')
			j := i + 1
			for ; j < len(e); j++ {
				if e[j] == '\\' && c == '\'' {
					if !escapes {
						// Its meaning hangs on the target's
						// standard_conforming_strings: refused.
						return errors.New("a backslash in a string constant without E")
					}
					j++
					continue
				}
				if e[j] == c {
					if j+1 < len(e) && e[j+1] == c {
						j++
						continue
					}
					break
				}
			}
			if j >= len(e) {
				return fmt.Errorf("an unterminated %c", c)
			}
			i = j
		case '$':
			if i+1 < len(e) && (e[i+1] == '$' || e[i+1] >= 'A' && e[i+1] <= 'z') && (i == 0 || !isIdentByte(e[i-1])) {
				return errors.New("a dollar-quoted string") // pg_get_expr never writes one
			}
		case '(':
			depth++
		case ')':
			if depth--; depth < 0 {
				return errors.New("unbalanced parentheses")
			}
		case ';':
			return errors.New("a semicolon")
		case '-', '/':
			if i+1 < len(e) && (c == '-' && e[i+1] == '-' || c == '/' && e[i+1] == '*') {
				return errors.New("a comment")
			}
		}
	}
	if depth != 0 {
		return errors.New("unbalanced parentheses")
	}
	return nil
}

// validateGenerated checks r's generated columns.
func (r Relation) validateGenerated(seen map[string]bool) []error {
	var errs []error
	for _, g := range r.Generated {
		if err := checkName(g.Name); err != nil {
			errs = append(errs, err)
		}
		if seen[g.Name] {
			errs = append(errs, fmt.Errorf("column %q twice", g.Name))
		}
		seen[g.Name] = true
		if !validType(g.Type) {
			errs = append(errs, fmt.Errorf("generated column %q: type %q", g.Name, g.Type))
		}
		if err := checkExpr(g.Expr); err != nil {
			errs = append(errs, fmt.Errorf("generated column %q: %w", g.Name, err))
		}
	}
	return errs
}
