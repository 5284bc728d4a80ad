package replicate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
	"github.com/cdcflow/eventservice/pkg/pgsource"
)

// Resume or start over: opening the source, and the snapshot-done record that decides it.

// startOrResume opens the source and decides, with what the target
// holds, whether the changefeed resumes or starts over from a new
// snapshot. The sink's Start fenced out every earlier process of the
// changefeed before (none of their transactions commits after this), so
// what the target holds is final.
//
//   - The slot exists and its snapshot completed: resume.
//   - The slot exists but its snapshot never completed, or its first
//     position was never saved: the target may lack rows nobody will send
//     again. Start over: empty the target if the changefeed wrote there
//     (one transaction; else only forget its checkpoints and state),
//     forget the positions, drop the slot, create it again. Each step leaves a state
//     the next start recognises (a slot without a completed snapshot, a
//     slot without a position, no slot), so a start-over interrupted at
//     any point starts over again.
//   - A new slot on a target an earlier sink of this changefeed wrote to
//     (the owner's wrote marker, pgsink.Sink.Wrote): what the target holds
//     belongs to an earlier slot and would survive the snapshot (rows
//     deleted meanwhile); empty it first. On a target the changefeed never
//     wrote to (an earlier start that failed before writing included),
//     existing tables are left as they are; checkpoints and a
//     snapshot-done record there belong to an earlier slot and are
//     cleared, so that a crash during this slot's snapshot starts over
//     rather than resumes.
func (p *parts) startOrResume(ctx context.Context, cfg Config) error {
	setup := func(err error) error { return fmt.Errorf("%w: %w", ErrSetup, err) }
	done, _, err := p.sink.State(ctx, snapshotKey(cfg.Slot))
	if err != nil {
		return setup(err)
	}
	if done != "" {
		// A snapshot record is this slot's only if the slot existed
		// before it: one Open is about to create belongs to an earlier
		// slot, and is cleared before the slot exists, so that no
		// interruption after the creation can leave a new slot next to
		// an old record (the next start would resume without a snapshot).
		exists, err := pgsource.SlotExists(ctx, cfg.Source, cfg.Slot)
		if err != nil {
			return setup(err)
		}
		if !exists {
			if err := p.sink.SetState(ctx, snapshotKey(cfg.Slot), ""); err != nil {
				return setup(err)
			}
			done = ""
		}
	}
	err = p.openSource(ctx, cfg)
	dropSlot := false
	switch {
	case errors.Is(err, pgsource.ErrUnknownSlot) && done == "":
		dropSlot = true
	case err != nil:
		return err
	case !p.info.Created && done == "":
		dropSlot = true
	}
	if !dropSlot && !p.info.Created {
		return nil // resume
	}
	empty := p.sink.Wrote()
	switch {
	case dropSlot:
		p.log.Warn("the initial snapshot did not complete: starting over (dropping the slot)", zap.String("slot", cfg.Slot), zap.Bool("empty_target", empty))
		p.source.Close()
	case empty:
		p.log.Warn("a new slot on a target this changefeed wrote to before: emptying the target before the snapshot", zap.String("slot", cfg.Slot))
	}
	if empty {
		err = p.sink.Reset(ctx, p.info.Tables)
	} else {
		err = p.sink.ClearProgress(ctx)
	}
	if err != nil {
		return setup(err)
	}
	if !dropSlot {
		return nil
	}
	if err := p.positions.Forget(ctx, cfg.Slot); err != nil {
		return setup(err)
	}
	if err := pgsource.DropSlot(ctx, cfg.Source, cfg.Slot); err != nil {
		return setup(err)
	}
	return p.openSource(ctx, cfg)
}

// openSource builds and opens the source.
func (p *parts) openSource(ctx context.Context, cfg Config) error {
	var err error
	linger, poll := cfg.SourceReadLinger, cfg.PublicationPollInterval
	if linger == 0 {
		linger = -1 // off (pgsource's zero is its default)
	}
	if poll == 0 {
		poll = -1
	}
	receive := cfg.SourceReceiveTimeout
	if receive == 0 {
		receive = -1
	}
	p.source, err = pgsource.New(pgsource.Options{DSN: cfg.Source, Slot: cfg.Slot, Publication: cfg.Publication, TakeOver: true,
		ManagePublication: p.pre.reg.CreatedPublication, Tables: cfg.tableRule(), NoDDLCapture: cfg.NoDDLCapture,
		ReadLinger: linger, ReceiveTimeout: receive, PublicationPollInterval: poll, CopyChunkRows: cfg.copyChunkRows, SlotStatsInterval: cfg.slotStatsInterval, Schema: p.schema, Positions: p.positions, SafePoint: p.sink.MinDurable, Logger: p.log, Registerer: p.reg,
		OnNewTable: func(rel pgcodec.Relation, firstTs common.Ts) {
			select {
			case p.newTables <- newTable{rel: rel, firstTs: firstTs}:
			case <-ctx.Done():
			}
		},
		OnRejoin: func(rel pgcodec.Relation) {
			select {
			case p.newTables <- newTable{rel: rel, rejoin: true}:
			case <-ctx.Done():
			}
		}})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	if p.info, err = p.source.Open(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	return nil
}

func snapshotKey(slot string) string { return "snapshot-done:" + slot }

// recordSnapshotAtStop records the initial snapshot as done after a clean
// stop's quiesce: every table was resolved to the last commit and the sink
// commits every checkpoint at once, so a snapshot the stream has passed is
// durable everywhere within moments (a wait bounded by ctx, recordAtStop's;
// polled, the sink has no signal for it).
func (p *parts) recordSnapshotAtStop(ctx context.Context, cfg Config) {
	for {
		done, err := p.recordSnapshot(ctx, cfg)
		if done {
			return
		}
		if err == nil {
			t := time.NewTimer(10 * time.Millisecond)
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				t.Stop()
				err = ctx.Err()
			}
		}
		p.log.Warn("stopping without recording the initial snapshot as done: the next start copies every table again", zap.Error(err))
		return
	}
}

// recordSnapshot records the initial snapshot as done once every table's
// durable checkpoint has reached its ts, and says whether it did.
func (p *parts) recordSnapshot(ctx context.Context, cfg Config) (bool, error) {
	lo, ok := p.sink.MinDurable()
	if !ok || lo < p.info.SnapshotTs {
		return false, nil
	}
	if err := p.sink.SetState(ctx, snapshotKey(cfg.Slot), strconv.FormatUint(uint64(p.info.SnapshotTs), 10)); err != nil {
		return false, err
	}
	p.log.Info("initial snapshot applied")
	return true, nil
}
