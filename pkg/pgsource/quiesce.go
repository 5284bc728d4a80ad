package pgsource

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
)

var (
	// errQuiesced ends the stream session after a Quiesce, for good.
	errQuiesced = errors.New("pgsource: quiesced")
	// errNotStreaming: Quiesce found no session open (the stream was
	// reconnecting): the slot keeps the position it last confirmed.
	errNotStreaming = errors.New("pgsource: quiesce: no stream session open")
)

// quiescePoll is how often a quiescing stream asks SafePoint whether the
// last commit is durable everywhere.
const quiescePoll = 20 * time.Millisecond

// Quiesce ends the stream at the last commit decoded, for a clean stop:
// the stream reads nothing more, the schema frontier and every
// subscription's resolved-ts move to that commit, and once SafePoint
// reaches it (every table has durably applied it) its position is saved
// and confirmed to the slot. The next start then resumes exactly there and
// reads nothing again, where a stop that only closed would leave the slot
// at the last position confirmed in passing (a second or more behind the
// slowest table, all of it decoded again at the next start).
//
// Quiesce returns nil once the last commit's position is confirmed; an
// error if ctx ends first (also while the initial snapshot is still being
// copied, or after the stream stopped: nothing answers then) or no
// session was open (the slot then keeps the
// position it had, as after a crash: nothing is lost). A session that took
// the request streams no more, whatever it returned; a request no session
// took before ctx ended is withdrawn, and the source streams on. Close is
// still needed either way.
func (s *Source) Quiesce(ctx context.Context) error {
	req := &quiesceReq{ctx: ctx, reply: make(chan error, 1)}
	s.mu.Lock()
	switch {
	case s.mu.closed:
		s.mu.Unlock()
		return ErrClosed
	case !s.mu.started || s.mu.quiesced || s.mu.quiesce != nil:
		s.mu.Unlock()
		return fmt.Errorf("%w: Quiesce needs a started source, once", ErrInvalidOptions)
	}
	s.mu.quiesce = req
	s.pokeLocked()
	s.mu.Unlock()
	select {
	case err := <-req.reply: // a session that took req gives up at ctx's end too
		return err
	case <-ctx.Done():
		select {
		case err := <-req.reply: // answered as ctx ended: the answer stands
			return err
		default:
		}
		// No session took req (the snapshot is still being copied, the
		// stream is between sessions or stopped) or the one that did is
		// giving up: either way the caller's time is up, and a request
		// still pending is withdrawn, so no session quiesces after the
		// caller was told it did not.
		s.mu.Lock()
		if s.mu.quiesce == req {
			s.mu.quiesce = nil
		}
		s.mu.Unlock()
		return fmt.Errorf("pgsource: quiesce: %w", ctx.Err())
	case <-s.ctx.Done():
		return ErrClosed
	}
}

// quiesceReq is a pending Quiesce: its context and where its answer goes.
type quiesceReq struct {
	ctx   context.Context
	reply chan error
}

// pokeLocked wakes the stream goroutine: the kick, and the open session's
// read, which otherwise waits for its next tick. REQUIRES: s.mu held.
func (s *Source) pokeLocked() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
	if c := s.mu.streamConn; c != nil {
		_ = c.SetReadDeadline(time.Unix(1, 0))
	}
}

// quiesce is the session's side of Quiesce: resolve everything to the last
// commit, wait for SafePoint to reach it, confirm it. A transaction being
// decoded is left to the slot (its rows pushed so far stay above every
// resolved-ts). ctx is the session's; req.ctx the caller's.
func (ss *session) quiesce(ctx context.Context, req *quiesceReq) error {
	s := ss.s
	s.mu.Lock()
	s.mu.quiesced = true
	s.mu.Unlock()
	ts := ss.core.last
	if err := ss.resolveAll(ctx, ts); err != nil {
		return err
	}
	for {
		if done, err := ss.confirmAt(ctx, ts); done || err != nil {
			if err != nil {
				return err
			}
			return ss.endStream(req)
		}
		t := s.opts.Clock.NewTimer(quiescePoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("pgsource: quiesce: the tables did not all apply %v: %w", ts, ctx.Err())
		case <-req.ctx.Done():
			t.Stop()
			return fmt.Errorf("pgsource: quiesce: the tables did not all apply %v: %w", ts, req.ctx.Err())
		case <-t.C():
		}
	}
}

// endStream ends the COPY and waits for the server's answer: the
// walsender reads the final status report before it, so once the answer
// is in, the slot's confirmed flush LSN is the one reported (a status
// report only sent would land after Quiesce returned, or, if the process
// exited at once, whenever the walsender read it).
func (ss *session) endStream(req *quiesceReq) error {
	deadline := clock.RealDeadline(quiesceEndWait) // a socket counts real time
	if d, ok := req.ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := ss.conn.Conn().SetReadDeadline(deadline); err != nil {
		return err
	}
	if _, err := pglogrepl.SendStandbyCopyDone(req.ctx, ss.conn); err != nil {
		return fmt.Errorf("pgsource: quiesce: end the stream: %w", err)
	}
	ss.s.log.Info("stream quiesced at the last commit", zap.Stringer("ts", ss.core.last))
	return nil
}

// quiesceEndWait bounds the wait for the server's answer to the end of the
// stream.
const quiesceEndWait = 5 * time.Second

// confirmAt reports the position to the server and whether it reached the
// commit at ts.
func (ss *session) confirmAt(ctx context.Context, ts common.Ts) (bool, error) {
	if err := ss.sendStatus(ctx); err != nil {
		return false, err
	}
	s := ss.s
	s.mu.Lock()
	saved := s.mu.saved
	s.mu.Unlock()
	return saved.Ts >= ts, nil
}
