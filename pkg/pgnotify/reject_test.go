package pgnotify

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/pkg/clock"
)

// encodedDSN creates a database of the given encoding on srv and returns
// a DSN for it with client_encoding UTF8 (what Go strings hold). The server
// converts every string it receives to the database's encoding, and
// refuses what does not fit with a data error no check at Publish can
// foresee, since it depends on that encoding: in LATIN1, valid UTF-8 with
// no LATIN1 equivalent ("€") is 22P05; in EUC_TW, where some CJK
// characters take 4 bytes against UTF-8's 3, a payload under the limit in
// UTF-8 can be over it, 22023.
func encodedDSN(t *testing.T, srv *pgtest.Server, encoding string) string {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.DSN)
	require.NoError(t, err)
	defer admin.Close(ctx)
	db := strings.ToLower(encoding)
	_, err = admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s ENCODING '%s' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0", db, encoding))
	require.NoError(t, err)
	return "postgres://postgres@" + srv.Addr + "/" + db + "?sslmode=disable&client_encoding=UTF8"
}

type rejection struct {
	channel, key string
	err          error
}

// TestAnEntryTheServerRefusesIsIsolatedAndDropped: one entry among 100 in
// a batch makes PostgreSQL refuse the whole statement with a data error
// (SQLSTATE class 22). It is classified permanent: the batch is bisected
// at once, the entry is dropped and reported when it fails alone, every
// other key arrives, the bad key's next (valid) payload goes out at once,
// and Close(drain) returns nil. The publisher's clock is a fake that never
// moves, so any back-off (the batch retried as a whole, the key backing off
// or quarantined) would hold Close until its deadline: the test needs no
// timing to tell prompt from late.
func TestAnEntryTheServerRefusesIsIsolatedAndDropped(t *testing.T) {
	srv := pgtest.Start(t)
	latin1, euctw := encodedDSN(t, srv, "LATIN1"), encodedDSN(t, srv, "EUC_TW")
	for _, tc := range []struct {
		name, dsn, sqlstate string
		conns               int
		addBad              func(t *testing.T, p *Publisher)
	}{
		// Publish refuses NUL: the set is fed directly, as a caller of an
		// older version or a missed check would have, to pin the server's
		// answer (22021) as permanent.
		{"NUL payload past Publish (22021)", srv.DSN, "22021", 1, func(t *testing.T, p *Publisher) {
			p.set.Add(pubKey{"state", "bad"}, "bad=\x00")
		}},
		{"payload without a LATIN1 equivalent (22P05)", latin1, "22P05", 1, func(t *testing.T, p *Publisher) {
			require.NoError(t, p.Publish("state", "bad", "bad=€"))
		}},
		{"channel without a LATIN1 equivalent (22P05)", latin1, "22P05", 1, func(t *testing.T, p *Publisher) {
			require.NoError(t, p.Publish("€", "bad", "bad=x"))
		}},
		{"payload under the limit in UTF-8, over it in EUC_TW (22023)", euctw, "22023", 1, func(t *testing.T, p *Publisher) {
			payload := "bad=" + strings.Repeat("丄", 2600) // 7,804 bytes; 10,404 in EUC_TW
			require.NoError(t, p.Publish("state", "bad", payload))
		}},
		{"4 connections (22P05)", latin1, "22P05", 4, func(t *testing.T, p *Publisher) {
			require.NoError(t, p.Publish("state", "bad", "bad=€"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testRefusedEntry(t, tc.dsn, tc.sqlstate, tc.conns, func(p *Publisher) { tc.addBad(t, p) })
		})
	}
}

func testRefusedEntry(t *testing.T, dsn, sqlstate string, conns int, addBad func(*Publisher)) {
	const good = 99
	expect := map[string]string{"bad": "fixed"}
	for k := range good {
		expect[fmt.Sprint(k)] = "1"
	}
	l, stopListening := listenFor(t, dsn, "state", &listenForTest{expect: expect, want: good + 1})
	p, err := New(Options{DSN: dsn, Connections: conns, Clock: clock.NewFake(time.Unix(1000, 0)), Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	rejected := make(chan rejection, 4)
	p.knobs.rejected = func(channel, key string, err error) { rejected <- rejection{channel, key, err} }
	// Queued before Start: the pump's first drain takes all 100 as one
	// batch, the bad entry in its middle.
	for k := range good {
		if k == good/2 {
			addBad(p)
		}
		require.NoError(t, p.Publish("state", fmt.Sprint(k), fmt.Sprintf("%d=1", k)))
	}
	require.NoError(t, p.Start())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // bounds a failure; nothing waits for it
	defer cancel()
	select {
	case r := <-rejected:
		require.Equal(t, "bad", r.key)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, r.err, &pgErr)
		require.Equal(t, sqlstate, pgErr.Code, "%v", pgErr)
	case <-ctx.Done():
		t.Fatal("the refused entry was never isolated and dropped")
	}
	// Dropped, not quarantined: the key's next payload is not held back.
	require.NoError(t, p.Publish("state", "bad", "bad=fixed"))
	require.NoError(t, p.Close(ctx, true), "Close(drain) settles with nothing left behind")
	waitListener(ctx, t, l, "every good key and the bad key's next payload")
	stopListening()
	require.Equal(t, good+1, l.count, "each good key once, the bad key only its valid payload")
	require.Zero(t, p.Pending())
	require.Equal(t, 1.0, testutil.ToFloat64(p.rejected))
	bisections := p.set.Stats().Bisections
	require.Positive(t, bisections, "isolated by bisection")
	require.Equal(t, float64(bisections+1), testutil.ToFloat64(p.statementErrors.WithLabelValues("rejected")),
		"the whole batch, then the failing half of each bisection: no statement retried")
	require.Zero(t, testutil.ToFloat64(p.statementErrors.WithLabelValues("other")))
	require.Zero(t, testutil.ToFloat64(p.statementErrors.WithLabelValues("connection")))
}

// TestListenRefusesAChannelTheDatabaseCannotHold: LISTEN on a channel the
// database's encoding has no characters for fails with SQLSTATE 22P05 on
// every connection; Listen returns ErrInvalidChannel instead of
// reconnecting for ever. Its clock is a fake that never moves, so a
// reconnect back-off would hold it until the deadline.
func TestListenRefusesAChannelTheDatabaseCannotHold(t *testing.T) {
	srv := pgtest.Start(t)
	dsn := encodedDSN(t, srv, "LATIN1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // bounds a failure
	defer cancel()
	connected := false
	err := Listen(ctx, ListenOptions{DSN: dsn, Channels: []string{"state", "€"}, Clock: clock.NewFake(time.Unix(1000, 0)),
		OnConnect: func(context.Context) error { connected = true; return nil },
		OnNotify:  func(string, string) {}})
	require.ErrorIs(t, err, ErrInvalidChannel)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22P05", pgErr.Code)
	require.NoError(t, ctx.Err(), "returned at once, not at the deadline")
	require.False(t, connected, "OnConnect runs only once every channel is listened to")
}

// TestTextCheckMatchesTheServers: what Publish refuses as a NUL or invalid
// UTF-8 is exactly what a UTF8 database refuses (convert_from verifies as
// the server's input does), over every 1- and 2-byte sequence and 3- and
// 4-byte ones with each lead byte, every second byte and the boundary
// values of the rest: nothing 22021 would refuse passes Publish, and
// nothing the server takes is refused.
func TestTextCheckMatchesTheServers(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `CREATE FUNCTION accepts(b bytea) RETURNS bool LANGUAGE plpgsql AS $$
		BEGIN PERFORM convert_from(b, 'UTF8'); RETURN true; EXCEPTION WHEN character_not_in_repertoire THEN RETURN false; END $$`)
	require.NoError(t, err)
	var seqs [][]byte
	for a := range 256 {
		seqs = append(seqs, []byte{byte(a)})
		for b := range 256 {
			seqs = append(seqs, []byte{byte(a), byte(b)})
			if a < 0xe0 {
				continue
			}
			for _, c := range []byte{0x00, 0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xff} {
				seqs = append(seqs, []byte{byte(a), byte(b), c})
				if a < 0xf0 {
					continue
				}
				for _, d := range []byte{0x00, 0x41, 0x80, 0xbf, 0xc0} {
					seqs = append(seqs, []byte{byte(a), byte(b), c, d})
				}
			}
		}
	}
	ours := make([]bool, len(seqs))
	for i, s := range seqs {
		ours[i] = badText(string(s)) < 0
	}
	rows, err := conn.Query(ctx, "SELECT b, ours FROM unnest($1::bytea[], $2::bool[]) AS t(b, ours) WHERE accepts(b) <> ours", seqs, ours)
	require.NoError(t, err)
	var disagree []string
	for rows.Next() {
		var b []byte
		var accepted bool
		require.NoError(t, rows.Scan(&b, &accepted))
		disagree = append(disagree, fmt.Sprintf("%x (Publish accepts: %v)", b, accepted))
	}
	require.NoError(t, rows.Err())
	require.Empty(t, disagree, "of %d sequences", len(seqs))
}
