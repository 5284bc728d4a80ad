package replicate

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
	"github.com/cdcflow/eventservice/pkg/pgsource"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// A table added to the publication with rows in it is copied while it is
// written to (ALTER PUBLICATION ... ADD TABLE, no change of it needed to
// find it), copied anew when it leaves the publication and joins it again,
// and so is one added while serve is down (at the next start: it
// has no checkpoint); a table the target lists as not yet copied (a copy a
// crash cut short) is copied again at a start, which brings back the rows
// the target lacks. Compare finds every published table equal after each.
// The tables are small and so are the chunks, so that a copy still spans
// many chunks (each a window the writer's changes fall in): the test
// copies a table six times, and at 20,000 rows of 3.2 KB in chunks of
// 4096 a loaded CI machine under -race moved about 130 rows/s and a phase
// outlasted its 2-minute wait.
func TestServeCopiesTablesThatJoinThePublication(t *testing.T) {
	const rows, chunk = 4000, 256
	p := newPair(t)
	lap := laps(t)
	p.exec("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
	p.exec("INSERT INTO t1 SELECT g, 'v' || g FROM generate_series(1, 10) g")
	for _, name := range []string{"t2", "t3"} {
		p.exec(fmt.Sprintf("CREATE TABLE %s (id int PRIMARY KEY, v text, body text)", name))
		p.exec(fmt.Sprintf("ALTER TABLE %s ALTER COLUMN body SET STORAGE EXTERNAL", name))
		// 3.2 KB: TOASTed, so that an update can leave it unchanged.
		p.exec(fmt.Sprintf("INSERT INTO %s SELECT g, 'v' || g, repeat(md5(g::text), 100) FROM generate_series(1, %d) g", name, rows))
	}
	p.exec("CREATE PUBLICATION cdcflow FOR TABLE t1")
	cfg := p.config()
	cfg.PublicationPollInterval = 50 * time.Millisecond
	cfg.copyChunkRows = chunk
	stop, _ := p.serve(cfg)
	p.waitEqual("t1's snapshot")
	lap("t1's snapshot")

	// t2 joins while a writer changes it: updates (some leaving the
	// TOASTed body unchanged), deletes, inserts, key changes.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var writes int
	wg.Go(func() {
		conn, err := pgx.Connect(ctx, p.src.DSN)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		for i := 0; ctx.Err() == nil; i++ {
			id := 1 + (i*7919)%rows
			q := []string{
				fmt.Sprintf("UPDATE t2 SET v = 'w%d' WHERE id = %d", i, id),
				fmt.Sprintf("DELETE FROM t2 WHERE id = %d", id),
				fmt.Sprintf("INSERT INTO t2 VALUES (%d, 'new', 'b') ON CONFLICT (id) DO UPDATE SET body = 'b%d'", rows+i, i),
				fmt.Sprintf("UPDATE t2 SET id = id + 100000 WHERE id = %d", id),
			}[i%4]
			if _, err := conn.Exec(ctx, q); err == nil {
				writes++
			}
		}
	})
	p.exec("ALTER PUBLICATION cdcflow ADD TABLE t2")
	// The writers run until most of the copy is in; not an assertion, the
	// comparison below is.
	testwait.Until(2*time.Minute, func() bool { return p.targetRows(t, "t2") >= rows*3/4 })
	cancel()
	wg.Wait()
	require.Positive(t, writes)
	p.waitEqual("t2, copied while written to")
	lap(fmt.Sprintf("t2, copied while written to (%d writes)", writes))

	// t2 leaves the publication and joins it again: its changes while it
	// was out are not streamed (the deletes would stay in the target), so
	// it is copied anew, emptied first. Whether a round of the poll sees it
	// out or only its new membership row, it is found.
	p.exec("ALTER PUBLICATION cdcflow DROP TABLE t2")
	p.exec("DELETE FROM t2 WHERE id % 5 = 0")
	p.exec("UPDATE t2 SET v = 'while out' WHERE id % 7 = 0")
	p.exec("ALTER PUBLICATION cdcflow ADD TABLE t2")
	p.waitEqual("t2, copied anew after it left the publication and joined again")
	require.NoError(t, stop())
	lap("t2, copied anew")

	// t3 joins while serve is down. t2's rejoin above was handled while
	// running, its new membership row recorded: this start does not take
	// it for one that rejoined while serve was down (it would copy it anew
	// for nothing).
	p.exec("ALTER PUBLICATION cdcflow ADD TABLE t3")
	stop, logs := p.serve(cfg)
	p.waitEqual("t3, joined while serve was down")
	require.NoError(t, stop())
	lap("t3, joined while serve was down")
	require.NotContains(t, logs.String(), "joined it again while serve was down")

	// A copy of t2 cut short: the target lacks rows and lists t2.
	dst, err := pgx.Connect(context.Background(), p.dst.DSN)
	require.NoError(t, err)
	defer dst.Close(context.Background())
	_, err = dst.Exec(context.Background(), "DELETE FROM t2 WHERE id % 3 = 0")
	require.NoError(t, err)
	var oid uint32
	require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT 't2'::regclass::oid").Scan(&oid))
	_, err = dst.Exec(context.Background(), "UPDATE cdcflow.state SET value = $1 WHERE key = $2", fmt.Sprint(oid), copiesKey(cfg.Slot))
	require.NoError(t, err)
	stop, _ = p.serve(cfg)
	p.waitEqual("t2, copied again")
	testwait.Within(t, time.Minute, "no copy left listed once the copies are durable", func() bool {
		var listed string
		require.NoError(t, dst.QueryRow(context.Background(), "SELECT value FROM cdcflow.state WHERE key = $1", copiesKey(cfg.Slot)).Scan(&listed))
		return listed == ""
	})
	require.NoError(t, stop())
	lap("t2, copied again")

	// t2 leaves the publication while serve is down, so the next start
	// does not bind it; rows are deleted while it is out; it joins again.
	// Its target rows are the changefeed's (a checkpoint names it), so it
	// is copied anew, emptied first.
	p.exec("ALTER PUBLICATION cdcflow DROP TABLE t2")
	stop, _ = p.serve(cfg)
	p.waitEqual("t2 out of the publication")
	p.exec("DELETE FROM t2 WHERE id % 11 = 0")
	p.exec("ALTER PUBLICATION cdcflow ADD TABLE t2")
	p.waitEqual("t2, copied anew after it joined again across a restart")
	require.NoError(t, stop())
	lap("t2, copied anew across a restart")

	// t3 leaves the publication and joins it again, both while serve is
	// down, and rows change while it is out: the next start finds it
	// published with a checkpoint, as before, but under a new membership
	// row, so it is copied anew, emptied first (the deleted rows would
	// otherwise stay in the target).
	p.exec("ALTER PUBLICATION cdcflow DROP TABLE t3")
	p.exec("DELETE FROM t3 WHERE id % 13 = 0")
	p.exec("UPDATE t3 SET v = 'while out' WHERE id % 17 = 0")
	p.exec("ALTER PUBLICATION cdcflow ADD TABLE t3")
	stop, logs = p.serve(cfg)
	p.waitEqual("t3, copied anew after it left and joined again while serve was down")
	require.NoError(t, stop())
	lap("t3, copied anew")
	require.Contains(t, logs.String(), "joined it again while serve was down")
	require.Contains(t, logs.String(), "t3")
}

// A clean stop right after a table's copy is applied takes it off the
// list of copies owed, so that the next start copies nothing again: a
// table that joins, then the same table left and joined again (a fresh
// copy). The copier's own settling is held back for an hour: without the
// settle at the stop, the list kept the table and the restart copied it
// again.
func TestACleanStopTakesOffTheCopiesItApplied(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
	p.exec("CREATE TABLE t2 (id int PRIMARY KEY, v text)")
	p.exec("INSERT INTO t1 SELECT g, 'v' || g FROM generate_series(1, 10) g")
	p.exec("INSERT INTO t2 SELECT g, 'v' || g FROM generate_series(1, 500) g")
	p.exec("CREATE PUBLICATION cdcflow FOR TABLE t1")
	cfg := p.config()
	cfg.PublicationPollInterval = 50 * time.Millisecond
	cfg.copySettleInterval = time.Hour
	cfg.LogLevel = "info" // the copier's "copying" line
	dst, err := pgx.Connect(context.Background(), p.dst.DSN)
	require.NoError(t, err)
	defer dst.Close(context.Background())
	listed := func() string {
		var v string
		require.NoError(t, dst.QueryRow(context.Background(), "SELECT coalesce((SELECT value FROM cdcflow.state WHERE key = $1), '')",
			copiesKey(cfg.Slot)).Scan(&v))
		return v
	}
	const copying = "copying the rows of a table that joined"

	stop, logs := p.serve(cfg)
	p.waitEqual("t1's snapshot")
	p.exec("ALTER PUBLICATION cdcflow ADD TABLE t2")
	p.waitEqual("t2, copied after it joined")
	require.NoError(t, stop(), logs.String())
	require.Contains(t, logs.String(), copying)
	require.Empty(t, listed(), "the stop took t2's applied copy off the list\n%s", logs.String())

	// The restart copies nothing; t2 leaves and joins again, rows deleted
	// while it was out (so that compare waits for its fresh copy).
	stop, logs = p.serve(cfg)
	p.exec("INSERT INTO t1 VALUES (11, 'after the restart')")
	p.waitEqual("resumed")
	p.exec("ALTER PUBLICATION cdcflow DROP TABLE t2")
	p.exec("DELETE FROM t2 WHERE id % 5 = 0")
	p.exec("ALTER PUBLICATION cdcflow ADD TABLE t2")
	p.waitEqual("t2, copied anew after it left and joined again")
	require.NoError(t, stop(), logs.String())
	require.Equal(t, 1, strings.Count(logs.String(), copying), "the restart copied nothing, the rejoin once\n%s", logs.String())
	require.Empty(t, listed(), "the stop took t2's applied fresh copy off the list\n%s", logs.String())

	stop, logs = p.serve(cfg)
	p.exec("INSERT INTO t1 VALUES (12, 'after the second restart')")
	p.waitEqual("resumed again")
	require.NoError(t, stop(), logs.String())
	require.NotContains(t, logs.String(), copying, "the restart copied a table whose fresh copy was applied")
}

func TestParseMembersReadsWhatFormatWritesAndSkipsTheRest(t *testing.T) {
	rec := memberRecord{publication: 16400, rows: map[uint32]uint32{16384: 16500, 16390: 16501, 4294967295: 1}}
	require.Equal(t, rec, parseMembers(formatMembers(rec)))
	require.Equal(t, "publication=16400,16384:16500,16390:16501,4294967295:1", formatMembers(rec))
	require.Equal(t, memberRecord{rows: map[uint32]uint32{7: 8}}, parseMembers("x,0:5,5:0,7:8,9:-1,1:2:3,,4294967296:1,publication=x"))
	require.Equal(t, memberRecord{rows: map[uint32]uint32{}}, parseMembers(""))
}

func TestRejoinedWhileDownNeedsBothRowsADifferenceAndTheSamePublication(t *testing.T) {
	recorded := memberRecord{publication: 9, rows: map[uint32]uint32{1: 10, 2: 20, 3: 30}}
	current := pgsource.Membership{Publication: 9, Rows: map[uint32]uint32{1: 10, 2: 21, 4: 40}}
	require.Equal(t, []uint32{2}, rejoinedWhileDown(recorded, current, []uint32{1, 2, 3, 4, 5}),
		"1 unchanged, 3 has no row now (out, or published by schema or all tables), 4 was never recorded, 5 has neither")
	current.Publication = 11
	require.Empty(t, rejoinedWhileDown(recorded, current, []uint32{1, 2, 3, 4, 5}), "another publication: every row is new, none compared")
}

// A table out of the publication at a start keeps its recorded row, so
// that its return under a new row is seen however many starts it sat out;
// another publication's rows are dropped.
func TestMergeMembersKeepsTheRowsOfTablesThatAreOut(t *testing.T) {
	recorded := memberRecord{publication: 9, rows: map[uint32]uint32{1: 10, 2: 20}}
	require.Equal(t, memberRecord{publication: 9, rows: map[uint32]uint32{1: 11, 2: 20, 3: 30}},
		mergeMembers(recorded, pgsource.Membership{Publication: 9, Rows: map[uint32]uint32{1: 11, 3: 30}}))
	require.Equal(t, memberRecord{publication: 12, rows: map[uint32]uint32{3: 30}},
		mergeMembers(recorded, pgsource.Membership{Publication: 12, Rows: map[uint32]uint32{3: 30}}))
}

// The recorded membership rows are the target's: whatever they hold,
// parsing never panics and yields only non-zero OID pairs.
func FuzzParseMembers(f *testing.F) {
	f.Add("16384:16500,16390:16501")
	f.Add(":,::,1:,:1,-1:2")
	f.Fuzz(func(t *testing.T, v string) {
		for table, row := range parseMembers(v).rows {
			if table == 0 || row == 0 {
				t.Fatalf("%q gave %d:%d", v, table, row)
			}
		}
	})
}

// laps returns a function that logs what a phase of the test took, since
// the last call: where a slow run spent its time.
func laps(t *testing.T) func(what string) {
	last := time.Now()
	return func(what string) {
		t.Logf("%s: %v", what, time.Since(last).Round(time.Millisecond))
		last = time.Now()
	}
}

// targetRows is how many rows a target table holds (0 until it exists).
func (p *pair) targetRows(t *testing.T, table string) int {
	conn, err := pgx.Connect(context.Background(), p.dst.DSN)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		return 0
	}
	return n
}

// The progress line names the table being copied, its rows so far and
// the tables queued behind it, and says nothing without copies.
func TestTheProgressLineShowsTheCopies(t *testing.T) {
	schema, err := schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1})
	require.NoError(t, err)
	src, err := pgsource.New(pgsource.Options{DSN: "postgres://nowhere", Schema: schema, Positions: nopPositions{}})
	require.NoError(t, err)
	defer src.Close()
	c := newCopier(&parts{source: src, log: zap.NewNop()}, "cdcflow", 0)
	require.Empty(t, c.status())
	c.add(pgcodec.Relation{Schema: "public", Name: "a"}, false)
	c.add(pgcodec.Relation{Schema: "public", Name: "b"}, false)
	require.Equal(t, "  copies: 2 tables queued", c.status())
	c.mu.Lock()
	c.current, c.queue = `"public"."a"`, c.queue[1:]
	c.mu.Unlock()
	require.Equal(t, `  copying "public"."a": 0 rows, 1 more tables queued`, c.status())
}

// nopPositions is a PositionStore that keeps nothing (the source is never
// opened).
type nopPositions struct{}

func (nopPositions) Save(context.Context, string, pgsource.Position) error { return nil }
func (nopPositions) Load(context.Context, string, uint64) (pgsource.Position, bool, error) {
	return pgsource.Position{}, false, nil
}

// Two tables join at once and the first one's copy cannot end (a commit
// waits for a synchronous standby, so every chunk is read again): the
// second waits in the queue, bound, its checkpoint written. A stop then
// must leave both listed, so that the next start copies both: listed only
// when its copy began, the second was taken for copied at the restart
// (it has a checkpoint) and its rows never came.
func TestServeListsEveryTableThatJoinedBeforeBindingIt(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
	for _, name := range []string{"t1", "t2", "t3"} {
		if name != "t1" {
			p.exec(fmt.Sprintf("CREATE TABLE %s (id int PRIMARY KEY, v text)", name))
		}
		p.exec(fmt.Sprintf("INSERT INTO %s SELECT g, 'v' || g FROM generate_series(1, 100) g", name))
	}
	p.exec("CREATE PUBLICATION cdcflow FOR TABLE t1")
	cfg := p.config()
	cfg.PublicationPollInterval = 50 * time.Millisecond
	stop, _ := p.serve(cfg)
	p.waitEqual("t1's snapshot")

	p.setSyncStandby(t, "nobody")
	released := false
	release := func() {
		if !released {
			released = true
			p.setSyncStandby(t, "")
		}
	}
	t.Cleanup(release)
	waiting := make(chan error, 1)
	go func() {
		conn, err := pgx.Connect(context.Background(), p.src.DSN)
		if err != nil {
			waiting <- err
			return
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(context.Background(), "UPDATE t1 SET v = 'waited' WHERE id = 1") // commits, then waits
		waiting <- err
	}()
	// The update waits for the standby before the tables join: begun
	// after a chunk's transaction, it would not hold the copies back.
	testwait.Within(t, time.Minute, "the update waiting for the standby", func() bool {
		var waitingForStandby bool
		require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event = 'SyncRep')").
			Scan(&waitingForStandby))
		return waitingForStandby
	})
	p.exec("SET synchronous_commit = local")
	p.exec("ALTER PUBLICATION cdcflow ADD TABLE t2, t3")
	dst, err := pgx.Connect(context.Background(), p.dst.DSN)
	require.NoError(t, err)
	defer dst.Close(context.Background())
	var oid3 uint32
	require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT 't3'::regclass::oid").Scan(&oid3))
	testwait.Within(t, time.Minute, "t3 bound and checkpointed while it waits for its copy", func() bool {
		var checkpointed bool
		require.NoError(t, dst.QueryRow(context.Background(), "SELECT EXISTS (SELECT FROM cdcflow.checkpoints WHERE table_oid = $1)",
			int64(oid3)).Scan(&checkpointed))
		return checkpointed
	})
	require.Zero(t, p.targetRows(t, "t2")+p.targetRows(t, "t3"), "no copy could end")
	require.NoError(t, stop())
	release()
	require.NoError(t, <-waiting)
	stop, _ = p.serve(cfg)
	p.waitEqual("t2 and t3, copied after the restart")
	require.NoError(t, stop())
}

// setSyncStandby sets the source's synchronous_standby_names and waits
// until the server has read it.
func (p *pair) setSyncStandby(t *testing.T, name string) {
	pgtest.Set(t, p.conn, "synchronous_standby_names", name)
}

func TestParseCopiesReadsWhatSaveWritesAndSkipsTheRest(t *testing.T) {
	require.Equal(t, map[uint32]bool{16384: false, 16390: true}, parseCopies("16384,16390!"))
	require.Empty(t, parseCopies(""))
	require.Equal(t, map[uint32]bool{7: true}, parseCopies("x,7,,7!,-1,99999999999,0,!"), "a duplicate keeps fresh")
}

// The list of copies in the target's state is the target's: whatever it
// holds, parsing it never panics and yields only OIDs.
func FuzzParseCopies(f *testing.F) {
	for _, s := range []string{"", "1", "1,2!", "!,,", "4294967295!", "4294967296"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		for oid := range parseCopies(v) {
			require.NotZero(t, oid)
		}
	})
}
