package pgsource

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/backoff"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// The commit-ts scheme. Commit i of the stream gets
//
//	ts(i) = max(ts(i-1) + 2, commit-time(i) in ms << 18)
//
// so it increases strictly in commit order (commit times need not), stays
// near the wall clock (resolved-ts lag is a time), and is a function of the
// WAL alone once the chain's seed is known: reading the same commits from
// the same position gives the same commit-ts, which is what lets the
// stream be read again from the slot (after a restart, a dropped
// connection, a late subscription) without duplicating or losing a row.
// The seed is the position saved for the slot's confirmed flush LSN
// (PositionStore). A new relation version inside commit i is a DDL at
// ts(i)-1, hence the step of 2: the DDL comes before the rows that use it.

// errReplay ends a stream session so that it starts again from the slot.
var errReplay = errors.New("pgsource: replay from the slot")

// maxJournal bounds the commits kept for choosing the slot's position.
const maxJournal = 1 << 16

// heartbeatPrefix marks the source's own logical messages.
const heartbeatPrefix = "cdcflow-heartbeat"

// run copies the snapshot, if any, then keeps a stream session open,
// restarting it from the slot's saved position after an error or a
// replay request.
func (s *Source) run() {
	if s.snapshot != nil {
		if err := s.copySnapshot(); err != nil {
			if s.ctx.Err() == nil {
				s.stop(fmt.Errorf("pgsource: initial snapshot: %w", err))
			}
			return
		}
	}
	// The reconnect back-off: 100ms doubling up to 5s, no jitter (one
	// stream per slot, no herd), started over after a session that lasted
	// (see reconnectDelay).
	reconnect := backoff.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}
	known := map[uint32]pgcodec.Relation{}
	for _, t := range s.tables {
		known[t.oid] = t.relation()
	}
	st := newStreamState(known)
	for s.ctx.Err() == nil {
		s.mu.Lock()
		from := s.mu.saved
		s.mu.replay = false
		if q := s.mu.quiesce; q != nil {
			// A Quiesce while no session is open: nothing decoded since
			// the last confirmed position is lost, but nothing more can
			// be confirmed without a session either.
			s.mu.quiesce, s.mu.quiesced = nil, true
			s.mu.Unlock()
			q.reply <- errNotStreaming
			return
		}
		s.mu.Unlock()
		began := s.opts.Clock.Now()
		err := s.session(from, st)
		if s.ctx.Err() != nil || errors.Is(err, errQuiesced) {
			return
		}
		switch {
		case isSlotLost(err):
			err = slotLostError(s.opts.Slot)
		case isSlotMissing(err):
			err = fmt.Errorf("%w: slot %s is gone from the source (dropped by an operator, or the changefeed removed); "+
				"a start creates a new one and copies every table anew: %w", ErrSlotDropped, s.opts.Slot, err)
		}
		if errors.Is(err, ErrProtocol) || errors.Is(err, ErrSlotTakenOver) || errors.Is(err, ErrSlotLost) || errors.Is(err, ErrSlotDropped) {
			s.stop(err)
			return
		}
		if errors.Is(err, errReplay) {
			s.met.replays.Inc()
			s.log.Info("stream restarts from the slot", zap.Stringer("from", pglogrepl.LSN(from.LSN)), zap.Stringer("ts", from.Ts))
			continue
		}
		s.met.reconnects.Inc()
		delay := reconnectDelay(&reconnect, s.opts.Clock.Now().Sub(began))
		// Logged once an outage (a source restarting fails every
		// attempt), named for what the server said: shutting down,
		// starting up, in recovery.
		s.link.Down(err, zap.Duration("next_attempt_in", delay))
		t := s.opts.Clock.NewTimer(delay)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-s.kick: // a replay or a Quiesce: the loop's top takes it
			t.Stop()
			select { // for the session's loop, if one opens
			case s.kick <- struct{}{}:
			default: // poked again meanwhile
			}
		case <-t.C():
		}
	}
}

// healthySession is how long a session must have lasted for the
// reconnect after it to start the back-off over: a walsender terminated
// after hours of streaming is retried at once, not after the delay that
// failures long ago had reached; one that keeps failing within this
// still backs off.
const healthySession = 30 * time.Second

// reconnectDelay is the wait before the next session, after one that
// lasted lasted.
func reconnectDelay(b *backoff.Backoff, lasted time.Duration) time.Duration {
	if lasted >= healthySession {
		b.Reset()
	}
	return b.Next()
}

// noteWALEnd records the server's WAL end from a keepalive: its gauge is
// never below the confirmed position (a keepalive of the session before
// a reconnect may be older than what the next one confirmed).
func (s *Source) noteWALEnd(lsn uint64) {
	s.walEnd.Store(lsn)
	s.met.walEnd.Set(float64(max(lsn, s.confirmed.Load())))
}

// noteConfirmed records the position confirmed to the slot.
func (s *Source) noteConfirmed(lsn uint64) {
	s.confirmed.Store(lsn)
	s.met.confirmedLSN.Set(float64(lsn))
	s.met.walEnd.Set(float64(max(lsn, s.walEnd.Load())))
}

// stop records why the source stopped for good.
func (s *Source) stop(err error) {
	s.log.Error("source stopped", zap.Error(err))
	s.mu.Lock()
	if s.mu.err == nil {
		s.mu.err = err
	}
	s.mu.Unlock()
}

// session is one replication connection, from a saved position: the
// shell around its core (core.go), which decides. It reads the socket,
// looks up what the core needs, steps it and carries its actions out.
type session struct {
	s       *Source
	conn    *pgconn.PgConn
	catalog *pgx.Conn // for type names of new relation versions
	// receiveTimeout is this session's (Source.receiveTimeout; 0: off).
	receiveTimeout time.Duration
	core           *core
	st             *streamState
	// subsVer is the version of the subscriptions last handed to the core
	// (subsTaken: at all): a subscription that arrives during a
	// transaction it needs replays it (Subscribe checks begun).
	subsVer   uint64
	subsTaken bool
	// copyDropsSeen is Source.copyDrops as last told to the core.
	copyDropsSeen uint64
	// pushCtx is the context of pushes (see push); pushCancel ends it,
	// at the latest when the session ends.
	pushCtx    context.Context
	pushCancel context.CancelFunc
	// resolvingGuards is pushResolved's scratch.
	resolvingGuards []*eventstore.SinkGuard
}

func (s *Source) session(from Position, st *streamState) error {
	ctx := s.ctx
	var conn *pgconn.PgConn
	var catalog *pgx.Conn
	if e := s.takeEarly(from); e != nil {
		conn, catalog = e.conn, e.catalog // started by OpenStream
	} else {
		var err error
		if conn, catalog, err = s.startStream(ctx, from); err != nil {
			return err
		}
	}
	defer conn.Close(context.Background())
	defer catalog.Close(context.Background())
	var err error
	if from, err = s.reseed(ctx, catalog, from); err != nil {
		return err
	}
	timeout, err := s.receiveTimeout(ctx, catalog, st.silentStreak)
	if err != nil {
		return err
	}
	c := newCore(st, from, s.opts.ChunkRows)
	c.skipRecentCheck = s.knobs.skipRecentCheck
	ss := &session{s: s, conn: conn, catalog: catalog, core: c, st: st, receiveTimeout: timeout, copyDropsSeen: s.copyDrops.Load()}
	s.streaming.Store(true)
	defer s.streaming.Store(false)
	s.link.Up()
	defer ss.endPushes()
	return ss.loop(ctx)
}

// startStream connects (or takes the slot's own connection, idle since the
// snapshot) and a catalog connection, and starts replication from from.
func (s *Source) startStream(ctx context.Context, from Position) (*pgconn.PgConn, *pgx.Conn, error) {
	var conn *pgconn.PgConn
	if s.snapshot != nil && s.snapshot.conn != nil {
		conn, s.snapshot.conn = s.snapshot.conn, nil
	} else {
		var err error
		if conn, err = connectReplication(ctx, s.opts.DSN, s.opts.ReadLinger); err != nil {
			return nil, nil, err
		}
	}
	catalog, err := connectControl(ctx, s.opts.DSN)
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, nil, err
	}
	args := []string{"proto_version '1'", fmt.Sprintf("publication_names '%s'", strings.Join(s.pubs, ",")), "messages 'true'"}
	if err := pglogrepl.StartReplication(ctx, conn, s.opts.Slot, pglogrepl.LSN(from.LSN), pglogrepl.StartReplicationOptions{PluginArgs: args}); err != nil {
		_ = conn.Close(context.Background())
		_ = catalog.Close(context.Background())
		return nil, nil, fmt.Errorf("start replication: %w", err)
	}
	return conn, catalog, nil
}

// lastChanceRead is how long a stream whose reply did not come by its
// deadline still reads before it calls the link silent.
const lastChanceRead = 50 * time.Millisecond

// receiveTimeout is a session's receive timeout: ReceiveTimeout, but at
// least twice the server's wal_sender_timeout (a walsender decoding a
// large transaction whose changes the publication filters out reads our
// requests for a reply only every wal_sender_timeout/2, and not at all
// before the fix of 15.2), doubled for each session in a row that ended
// silent (up to 16 times): a session that times out again and again
// would replay the same stretch of WAL for ever. 0: off.
func (s *Source) receiveTimeout(ctx context.Context, catalog *pgx.Conn, silentStreak int) (time.Duration, error) {
	t := s.opts.ReceiveTimeout
	if t <= 0 {
		return 0, nil
	}
	var ms int64
	if err := catalog.QueryRow(ctx, "SELECT setting::bigint FROM pg_settings WHERE name = 'wal_sender_timeout'").Scan(&ms); err != nil {
		return 0, fmt.Errorf("%w: wal_sender_timeout: %w", ErrConnect, err)
	}
	t = max(t, 2*time.Duration(ms)*time.Millisecond)
	return t << min(silentStreak, 4), nil
}

// reseed reads the slot's confirmed flush LSN and, past from, the
// position saved there, and continues the chain where reseedFrom says:
// the session's own position, or the one another process of the
// changefeed confirmed to.
func (s *Source) reseed(ctx context.Context, catalog *pgx.Conn, from Position) (Position, error) {
	var text string
	if err := catalog.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", s.opts.Slot).Scan(&text); err != nil {
		return from, fmt.Errorf("pgsource: the slot's confirmed flush LSN: %w", err)
	}
	confirmed, err := pglogrepl.ParseLSN(text)
	if err != nil {
		return from, fmt.Errorf("%w: confirmed flush LSN %q: %w", ErrProtocol, text, err)
	}
	if uint64(confirmed) <= from.LSN {
		return from, nil
	}
	loaded, ok, err := s.opts.Positions.Load(ctx, s.opts.Slot, uint64(confirmed))
	if err != nil {
		return from, fmt.Errorf("pgsource: load the position of %v: %w", confirmed, err)
	}
	p, err := reseedFrom(from, uint64(confirmed), loaded, ok, s.allSubs())
	if err != nil {
		return from, err
	}
	s.log.Warn("another process of the changefeed confirmed the slot past this source's position: continuing from its position",
		zap.Stringer("from", pglogrepl.LSN(from.LSN)), zap.Stringer("confirmed", confirmed), zap.Stringer("ts", p.Ts))
	s.mu.Lock()
	if p.LSN > s.mu.saved.LSN {
		s.mu.saved = p
		s.committed.Store(max(s.committed.Load(), uint64(p.Ts)))
	}
	s.mu.Unlock()
	s.noteConfirmed(p.LSN)
	return p, nil
}

// loop reads the stream, pushing rows as transactions arrive, advancing
// the subscriptions' resolved-ts every ResolvedInterval and reporting the
// safe position every StatusInterval: each iteration takes a kick (a
// replay or a quiesce), runs the ticks due, steps liveness, arms the read
// deadline for the next of them and reads one message.
func (ss *session) loop(ctx context.Context) error {
	s := ss.s
	// The read wakes at the next tick by the connection's read deadline,
	// set when the tick moves, and at ctx's end by a deadline in the past,
	// not by a context deadline per message, which pgconn watches one by one.
	netConn := ss.conn.Conn()
	lingerOf(ss.conn).stream()
	stopWatch := context.AfterFunc(ctx, func() { _ = netConn.SetReadDeadline(time.Unix(1, 0)) })
	defer stopWatch()
	s.mu.Lock()
	s.mu.streamConn = netConn
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.mu.streamConn = nil
		s.mu.Unlock()
	}()
	lp := &loopState{nextResolved: s.now().Add(s.opts.ResolvedInterval), nextStatus: s.now().Add(s.opts.StatusInterval),
		watch: clock.StartStopwatch(), live: newLiveness(ss.receiveTimeout), socket: lingerOf(ss.conn)}
	for {
		if err := ss.takeKick(ctx, lp); err != nil {
			return err
		}
		now := s.now()
		if err := ss.runTicks(ctx, lp, now); err != nil {
			return err
		}
		wake := minTime(lp.nextResolved, lp.nextStatus)
		if ss.receiveTimeout > 0 {
			in, err := ss.stepLiveness(ctx, lp)
			if err != nil {
				return err
			}
			wake = minTime(wake, now.Add(in))
		}
		if !wake.Equal(lp.armed) {
			// The ticks are on the source's clock; the socket counts
			// real time, so it gets the wait, not the instant.
			if err := netConn.SetReadDeadline(clock.RealDeadline(wake.Sub(now))); err != nil {
				return err
			}
			lp.armed = wake
		}
		// Checked after arming: a cancel before it ends the loop here, one
		// after it moves the deadline past (AfterFunc runs once ctx ended).
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := ss.receive(ctx, lp); err != nil {
			return err
		}
	}
}

// loopState is loop's, between its iterations.
type loopState struct {
	nextResolved, nextStatus time.Time
	// armed is the read deadline set (zero: to be set again).
	armed time.Time
	// Liveness (Options.ReceiveTimeout, liveness.go), in real time since
	// the session began (a stopwatch: the source's clock may be a test's,
	// the socket's deadlines are real); the server is heard at the top of
	// the iteration after a message arrived: late, never early.
	watch      clock.Stopwatch
	live       liveness
	gotMessage bool
	// Bytes count too (lingerConn.got), not only whole messages: a
	// message of hundreds of megabytes over a slow link takes longer than
	// the timeout to arrive, and taken for silence it was read again by
	// every new session, for ever.
	socket *lingerConn
	got    int64
}

// takeKick handles a kick: a quiesce ends the session after it
// (errQuiesced), a replay ends it so that the stream starts again from the
// slot (errReplay); otherwise poke moved the read deadline.
func (ss *session) takeKick(ctx context.Context, lp *loopState) error {
	s := ss.s
	select {
	case <-s.kick:
	default:
		return nil
	}
	s.mu.Lock()
	replay, q := s.mu.replay, s.mu.quiesce
	s.mu.quiesce = nil
	s.mu.Unlock()
	if q != nil {
		q.reply <- ss.quiesce(ctx, q)
		return errQuiesced
	}
	if replay {
		return errReplay
	}
	lp.armed = time.Time{}
	return nil
}

// runTicks advances the resolved-ts and reports the position when due.
func (ss *session) runTicks(ctx context.Context, lp *loopState, now time.Time) error {
	if !now.Before(lp.nextResolved) {
		if err := ss.advanceResolved(ctx); err != nil {
			return err
		}
		lp.nextResolved = now.Add(ss.resolvedInterval())
	}
	if !now.Before(lp.nextStatus) {
		if err := ss.sendStatus(ctx); err != nil {
			return err
		}
		lp.nextStatus = now.Add(ss.s.opts.StatusInterval)
	}
	return nil
}

// stepLiveness steps liveness with what arrived since the last step and
// does what it says; it returns how long until the next step is due.
func (ss *session) stepLiveness(ctx context.Context, lp *loopState) (time.Duration, error) {
	if lp.socket != nil {
		if n := lp.socket.got.Load(); n != lp.got {
			lp.got, lp.gotMessage = n, true
		}
	}
	v := lp.live.step(lp.watch.Elapsed(), lp.gotMessage)
	lp.gotMessage = false
	if v.heardPastTimeout {
		ss.st.silentStreak = 0 // this session lived past a timeout and heard on
	}
	if v.ask {
		if err := ss.askReply(ctx); err != nil {
			return 0, err
		}
	}
	if v.silent {
		ss.s.met.silences.Inc()
		ss.st.silentStreak++
		return 0, fmt.Errorf("%w: nothing for %v, %v since a reply was asked for (timeout %v)",
			ErrSourceSilent, v.quiet, v.sinceAsk, ss.receiveTimeout)
	}
	return v.wakeIn, nil
}

// receive reads one message (until the read deadline) and handles it: an
// error the server sent, a keepalive, or WAL data for the core.
func (ss *session) receive(ctx context.Context, lp *loopState) error {
	s := ss.s
	raw, err := ss.conn.ReceiveMessage(context.Background())
	if err != nil {
		if pgconn.Timeout(err) && ctx.Err() == nil {
			lp.armed = time.Time{} // re-arm: on a fake clock the tick may not be due yet
			return nil
		}
		return err
	}
	if h := s.knobs.replyHeard; h != nil && lp.live.asked >= 0 {
		h()
	}
	lp.gotMessage = true
	switch m := raw.(type) {
	case *pgproto3.ErrorResponse:
		// A *pgconn.PgError, as pgx returns for any other statement: a
		// caller tells a terminated walsender (57P01) from a dropped slot
		// by its Code (errors.As).
		return fmt.Errorf("replication: %w", pgconn.ErrorResponseToPgError(m))
	case *pgproto3.CopyData:
		if len(m.Data) == 0 {
			return fmt.Errorf("%w: empty CopyData", ErrProtocol)
		}
		switch m.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
			if err != nil {
				return fmt.Errorf("%w: keepalive: %w", ErrProtocol, err)
			}
			s.noteWALEnd(uint64(k.ServerWALEnd))
			ss.core.keepalive(uint64(k.ServerWALEnd))
			if k.ReplyRequested {
				if err := ss.sendStatus(ctx); err != nil {
					return err
				}
				lp.nextStatus = s.now().Add(s.opts.StatusInterval)
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(m.Data[1:])
			if err != nil {
				return fmt.Errorf("%w: XLogData: %w", ErrProtocol, err)
			}
			return ss.handle(ctx, x.WALData)
		}
	}
	return nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// resolvedInterval is ResolvedInterval, stretched so that the resolved-ts
// pushes stay within ResolvedPushesPerSec: each is a store write, a
// notification and a preparation for the service, so their rate, not the
// number of tables, bounds that work.
func (ss *session) resolvedInterval() time.Duration {
	s := ss.s
	s.mu.Lock()
	n := 0
	for _, l := range s.mu.subs {
		n += len(l)
	}
	s.mu.Unlock()
	return max(s.opts.ResolvedInterval, time.Duration(n)*time.Second/time.Duration(s.opts.ResolvedPushesPerSec))
}

// advanceResolved moves the schema frontier and every subscription's
// resolved-ts to the last commit.
func (ss *session) advanceResolved(ctx context.Context) error {
	return ss.resolveAll(ctx, ss.core.resolveTarget())
}

// resolveAll moves the schema frontier and every subscription's
// resolved-ts to ts.
func (ss *session) resolveAll(ctx context.Context, ts common.Ts) error {
	ss.core.resolve(ts, ss.s.allSubs())
	return ss.carry(ctx)
}

// sendStatus confirms to the server the last position below the safe
// point, after saving it.
func (ss *session) sendStatus(ctx context.Context) error { return ss.report(ctx, false) }

// askReply sends the status report with a reply requested: a live
// walsender answers with a keepalive at once (ReceiveTimeout).
func (ss *session) askReply(ctx context.Context) error { return ss.report(ctx, true) }

// saveTimeout bounds a status report's save of the slot's position.
const saveTimeout = 5 * time.Second

// report confirms to the server the last position below the safe point,
// after saving it, asking for a reply if reply is set.
func (ss *session) report(ctx context.Context, reply bool) error {
	s := ss.s
	safe, ok := s.opts.SafePoint()
	s.mu.Lock()
	saved := s.mu.saved
	holds := make([]common.Ts, 0, len(s.mu.holds))
	for _, hold := range s.mu.holds {
		holds = append(holds, hold)
	}
	s.mu.Unlock()
	next := nextConfirm(saved, ss.core.journal, ss.core.walEnd, safe, ok, holds)
	if next.LSN > saved.LSN {
		// Bounded: a target that vanished without a word would hold the
		// stream (and the walsender's replies) until TCP gives up.
		sctx, cancel := context.WithTimeout(ctx, saveTimeout)
		err := s.opts.Positions.Save(sctx, s.opts.Slot, next)
		cancel()
		if err != nil {
			// The store of positions (the target, for serve) is down:
			// confirm nothing new this time, but keep the session, which
			// is the source's and fine (the target's outage is its own
			// to report). Ending it made a target outage read as the
			// source's stream ending, over and over.
			s.log.Debug("save the slot's position: confirming none this time", zap.Error(err))
			next = saved
		}
	}
	if next.LSN > saved.LSN {
		s.mu.Lock()
		s.mu.saved = next
		s.mu.Unlock()
		ss.core.confirmed(next)
		s.noteConfirmed(next.LSN)
	}
	lsn := pglogrepl.LSN(next.LSN)
	return pglogrepl.SendStandbyStatusUpdate(ctx, ss.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: lsn, WALFlushPosition: lsn, WALApplyPosition: lsn, ReplyRequested: reply})
}
