package replicate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcflow/eventservice/internal/pglink"
	"github.com/cdcflow/eventservice/pkg/pgsink"
	"github.com/cdcflow/eventservice/pkg/pgsource"
)

// ErrSlotActive: remove found a serve streaming the slot (without force).
var ErrSlotActive = errors.New("a serve holds the slot")

// RemoveOptions name the changefeed to remove.
type RemoveOptions struct {
	Source, Sink, Slot, Publication string
	// Force removes it while a serve streams its slot: that serve is
	// fenced out of the target (it stops as superseded) and its
	// walsender terminated first.
	Force bool
}

// Remove removes a changefeed: its slot, its publication if it created
// it, its registration on the source, and the target's cdcflow schema
// (checkpoints, positions, state), keeping the target's tables and rows.
// The binding is checked first, as a start checks it: a slot registered
// for another target is never dropped. While a serve streams the slot it
// is refused (ErrSlotActive) unless Force. What is gone already is
// skipped, so a remove interrupted anywhere can be run again.
func Remove(ctx context.Context, o RemoveOptions, out io.Writer) error {
	src, err := pgsource.Connect(ctx, o.Source)
	if err != nil {
		return fmt.Errorf("%w: the source: %s", ErrSetup, pglink.Cause(err))
	}
	defer src.Close(context.Background())
	dst, err := pgsink.Connect(ctx, o.Sink)
	if err != nil {
		return fmt.Errorf("%w: the target: %s", ErrSetup, pglink.Cause(err))
	}
	defer dst.Close(context.Background())
	srcID, err := pglink.Identify(ctx, src)
	if err != nil {
		return fmt.Errorf("%w: the source: %w", ErrSetup, err)
	}
	dstID, err := pglink.Identify(ctx, dst)
	if err != nil {
		return fmt.Errorf("%w: the target: %w", ErrSetup, err)
	}
	if srcID.Same(dstID) {
		return fmt.Errorf("%w: %w: --source and --sink both reach %s", ErrSetup, ErrSameDatabase, srcID)
	}
	reg, found, err := pgsource.LoadRegistration(ctx, src, o.Slot)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	if found && !reg.TargetID.Same(dstID) {
		return fmt.Errorf("%w: %w: slot %s is the changefeed into %s, not into %s: nothing removed", ErrSetup, pgsource.ErrNotOwner,
			o.Slot, reg.Target, dstID)
	}
	owners, err := pgsink.ReadOwners(ctx, dst)
	if err != nil {
		return fmt.Errorf("%w: the target's changefeeds: %w", ErrSetup, err)
	}
	ownedHere := false
	for _, ow := range owners {
		if ow.Name != o.Slot {
			return fmt.Errorf("%w: the target holds changefeed %q too: nothing removed (its cdcflow schema is shared)", ErrSetup, ow.Name)
		}
		if ow.Source != "" && ow.Source != srcID.Key() {
			return fmt.Errorf("%w: %w: the target's changefeed %q replicates source %s, not %s: nothing removed", ErrSetup,
				pgsink.ErrOtherSource, ow.Name, ow.Source, srcID)
		}
		ownedHere = true
	}
	st, err := pgsource.ReadSlotStats(ctx, src, o.Slot)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	if !found && st.Exists && !ownedHere {
		return fmt.Errorf("%w: %w: slot %s exists, but no changefeed registered it and this target holds none of it: nothing removed",
			ErrSetup, pgsource.ErrNotOwner, o.Slot)
	}
	if st.ActivePID != 0 && !o.Force {
		return fmt.Errorf("%w: %w: walsender pid %d streams slot %s (a serve runs): stop it first, or use --force", ErrSetup, ErrSlotActive,
			st.ActivePID, o.Slot)
	}
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	if st.ActivePID != 0 {
		// The running serve is fenced out of the target first, so that it
		// writes nothing more and exits as superseded; then its walsender
		// goes, so the slot can be dropped.
		if err := pgsink.FenceOut(ctx, dst, o.Slot, time.Minute); err != nil {
			return fmt.Errorf("fence out the running serve: %w", err)
		}
		say("fenced out the serve of changefeed %s in the target", o.Slot)
		// It checks its fence every second and exits as superseded,
		// closing its stream; what is still attached after this is
		// terminated by the drop.
		if gone := waitSlotReleased(ctx, src, o.Slot, 10*time.Second); gone {
			say("the serve left the slot")
		}
	}
	if st.Exists {
		if err := pgsource.DropSlot(ctx, o.Source, o.Slot); err != nil {
			return fmt.Errorf("drop slot %s: %w", o.Slot, err)
		}
		say("dropped slot %s (it retained %s of WAL)", o.Slot, bytesText(st.RetainedBytes))
	}
	pub := o.Publication
	if found {
		pub = reg.Publication
	}
	if found && reg.CreatedPublication {
		if err := dropPublication(ctx, src, pub); err != nil {
			return err
		}
		say("dropped publication %s (the changefeed created it)", pub)
	} else if pub != "" {
		say("kept publication %s (the changefeed did not create it)", pub)
	}
	if err := pgsource.Unregister(ctx, src, o.Slot); err != nil {
		return err
	}
	if found {
		say("unregistered the changefeed on the source")
	}
	var hasSchema bool
	if err := dst.QueryRow(ctx, "SELECT to_regnamespace('cdcflow') IS NOT NULL").Scan(&hasSchema); err != nil {
		return err
	}
	if hasSchema {
		if err := dropSinkState(ctx, dst); err != nil {
			return fmt.Errorf("drop the target's cdcflow state: %w", err)
		}
		say("dropped the target's cdcflow state (checkpoints, positions, owners); its tables and rows are kept")
	}
	return nil
}

// dropSinkState drops what a changefeed keeps in its target's cdcflow
// schema, and the schema unless the database is also a changefeed's
// source, whose registry (cdcflow.changefeeds) lives there too.
func dropSinkState(ctx context.Context, dst *pgx.Conn) error {
	var registry bool
	if err := dst.QueryRow(ctx, "SELECT to_regclass('cdcflow.changefeeds') IS NOT NULL").Scan(&registry); err != nil {
		return err
	}
	stmt := "DROP SCHEMA cdcflow CASCADE"
	if registry {
		stmt = `DROP TABLE IF EXISTS cdcflow.checkpoints, cdcflow.state, cdcflow.owners, cdcflow.source_positions;
DROP FUNCTION IF EXISTS cdcflow.fence(text, bigint)`
	}
	_, err := dst.Exec(ctx, stmt)
	return err
}

// dropPublication drops publication pub and its companion of inserts
// (pgsource.InsertsPublication), if they exist.
func dropPublication(ctx context.Context, src *pgx.Conn, pub string) error {
	for _, p := range []string{pub, pgsource.InsertsPublication(pub)} {
		if _, err := src.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{p}.Sanitize()); err != nil {
			return fmt.Errorf("drop publication %s: %w", p, err)
		}
	}
	return nil
}

// waitSlotReleased waits up to d for no walsender to stream slot (polling
// the server with a deadline), and says whether none does.
func waitSlotReleased(ctx context.Context, src *pgx.Conn, slot string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		st, err := pgsource.ReadSlotStats(ctx, src, slot)
		if err != nil || st.ActivePID == 0 {
			return err == nil
		}
		if time.Now().After(deadline) {
			return false
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}
