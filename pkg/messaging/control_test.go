package messaging

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

func TestControlRequestsValidate(t *testing.T) {
	id := testDispatcher
	good := RegisterRequest{Dispatcher: id, Registration: 3, Span: common.TableSpan(1), StartTs: 10, Target: "t"}
	require.NoError(t, good.Validate())
	for name, r := range map[string]RegisterRequest{
		"zero dispatcher":   {Registration: 3, Span: common.TableSpan(1), Target: "t"},
		"zero registration": {Dispatcher: id, Span: common.TableSpan(1), Target: "t"},
		"bad span":          {Dispatcher: id, Registration: 3, Span: common.Span{TableID: -1}, Target: "t"},
		"no target":         {Dispatcher: id, Registration: 3, Span: common.TableSpan(1)},
		"target not UTF-8":  {Dispatcher: id, Registration: 3, Span: common.TableSpan(1), Target: "\xff\xfe"},
		"target too long":   {Dispatcher: id, Registration: 3, Span: common.TableSpan(1), Target: Target(strings.Repeat("a", MaxTargetBytes+1))},
		"target with space": {Dispatcher: id, Registration: 3, Span: common.TableSpan(1), Target: "a b"},
	} {
		require.ErrorIs(t, r.Validate(), ErrInvalidRequest, name)
	}
	err := RegisterRequest{}.Validate()
	for _, want := range []string{"zero dispatcher", "zero registration", "invalid target: empty name"} {
		require.Contains(t, err.Error(), want, "every problem is reported")
	}

	require.NoError(t, ResetRequest{Dispatcher: id, Registration: 3, Epoch: 2}.Validate())
	require.ErrorIs(t, ResetRequest{Dispatcher: id, Registration: 3, Epoch: 1}.Validate(), ErrInvalidRequest,
		"a registration starts at epoch 1: a reset goes above it")
	require.ErrorIs(t, ResetRequest{Dispatcher: id, Epoch: 2}.Validate(), ErrInvalidRequest)
	require.NoError(t, RemoveRequest{Dispatcher: id, Registration: 3}.Validate())
	require.ErrorIs(t, RemoveRequest{Registration: 3}.Validate(), ErrInvalidRequest)
	require.NoError(t, HeartbeatRequest{Checkpoints: make([]DispatcherCheckpoint, MaxHeartbeatCheckpoints)}.Validate())
	require.ErrorIs(t, HeartbeatRequest{Checkpoints: make([]DispatcherCheckpoint, MaxHeartbeatCheckpoints+1)}.Validate(), ErrInvalidRequest)
}

// Every control-plane sentinel survives a trip through its Code, as over
// a network: the receiving side's errors.Is finds the same sentinel.
func TestCodesRoundTrip(t *testing.T) {
	require.Equal(t, CodeOK, CodeOf(nil))
	require.NoError(t, CodeOK.Err())
	for c := CodeInvalidRequest; c < numCodes; c++ {
		sentinel := c.Err()
		require.Error(t, sentinel, c.String())
		wrapped := fmt.Errorf("context: %w", sentinel)
		require.Equal(t, c, CodeOf(wrapped), c.String())
		require.ErrorIs(t, CodeOf(wrapped).Err(), sentinel)
	}
	require.Equal(t, CodeInternal, CodeOf(errors.New("something else")))
	require.Equal(t, "stale_registration", CodeStaleRegistration.String())
	require.Equal(t, "code(200)", Code(200).String())
	require.ErrorIs(t, Code(200).Err(), ErrInternal, "a code from a newer peer is an internal error")
	require.Equal(t, "00000000000000ff", RegistrationID(255).String())
}

// Target names become metric labels: only a small printable set passes.
func TestTargetValidate(t *testing.T) {
	for _, ok := range []Target{"changefeed-1", "a", "cf_2.x:eu/west@1", Target(strings.Repeat("z", MaxTargetBytes))} {
		require.NoError(t, ok.Validate(), "%q", ok)
	}
	for _, bad := range []Target{"", "\xff\xfe", "é", "a\x00b", "a b", "a\n", "{x}", "a\"b", Target(strings.Repeat("z", MaxTargetBytes+1))} {
		require.ErrorIs(t, bad.Validate(), ErrInvalidTarget, "%q", bad)
	}
}

// TestRegisterEachAnswersEveryEntry: RegisterEach calls register once per
// entry, in order, and answers each with its error's code; a batch of no
// or too many entries is refused whole.
func TestRegisterEachAnswersEveryEntry(t *testing.T) {
	var seen []common.DispatcherID
	register := func(_ context.Context, r RegisterRequest) error {
		seen = append(seen, r.Dispatcher)
		if r.Dispatcher.Lo == 2 {
			return fmt.Errorf("%w: taken", ErrDispatcherExists)
		}
		return nil
	}
	req := RegisterBatchRequest{Requests: []RegisterRequest{{Dispatcher: common.DispatcherID{Lo: 1}}, {Dispatcher: common.DispatcherID{Lo: 2}}}}
	reply, err := RegisterEach(context.Background(), register, req)
	require.NoError(t, err)
	require.Equal(t, []Code{CodeOK, CodeDispatcherExists}, reply.Codes)
	require.Equal(t, []common.DispatcherID{{Lo: 1}, {Lo: 2}}, seen)
	for _, bad := range []RegisterBatchRequest{{}, {Requests: make([]RegisterRequest, MaxRegisterBatch+1)}} {
		_, err := RegisterEach(context.Background(), register, bad)
		require.ErrorIs(t, err, ErrInvalidRequest)
	}
	require.Len(t, seen, 2, "a refused batch calls nothing")
}
