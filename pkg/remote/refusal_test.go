package remote

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/tlstest"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// ownedControl is a control plane that keeps registrations and refuses as
// the event service does today, word for word and in its order (the edge
// under test is what the wire lets through): a Reset or Remove looks the
// dispatcher up (unknown), compares the registration (stale, naming the
// current one), then checks the caller's authority (permission denied); a
// Register of a taken ID is ErrDispatcherExists naming the registration; a
// heartbeat entry is checked for authority first.
type ownedControl struct {
	mu   sync.Mutex
	regs map[common.DispatcherID]ownedReg
}

type ownedReg struct {
	target messaging.Target
	reg    messaging.RegistrationID
}

func (c *ownedControl) lookupFor(ctx context.Context, id common.DispatcherID, reg messaging.RegistrationID, op string) (ownedReg, error) {
	r, ok := c.regs[id]
	switch {
	case !ok:
		return r, fmt.Errorf("%w: %v", messaging.ErrUnknownDispatcher, id)
	case r.reg != reg:
		return r, fmt.Errorf("%w: %v registration %v, current %v", messaging.ErrStaleRegistration, id, reg, r.reg)
	}
	if auth := messaging.AuthorityOf(ctx); !messaging.MayServe(auth, r.target) {
		return r, fmt.Errorf("%w: %q may not %s: it is another target's", messaging.ErrPermissionDenied, auth.Identity(), op)
	}
	return r, nil
}

func (c *ownedControl) Register(ctx context.Context, q messaging.RegisterRequest) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	auth := messaging.AuthorityOf(ctx)
	if !messaging.MayServe(auth, q.Target) {
		return fmt.Errorf("%w: %q may not register under target %q", messaging.ErrPermissionDenied, auth.Identity(), q.Target)
	}
	if r, ok := c.regs[q.Dispatcher]; ok {
		if q.Replace && !messaging.MayServe(auth, r.target) {
			return fmt.Errorf("%w: %q may not take over %v: it is another target's", messaging.ErrPermissionDenied, auth.Identity(), q.Dispatcher)
		}
		return fmt.Errorf("%w: %v (registration %v, asked %v)", messaging.ErrDispatcherExists, q.Dispatcher, r.reg, q.Registration)
	}
	c.regs[q.Dispatcher] = ownedReg{target: q.Target, reg: q.Registration}
	return nil
}

func (c *ownedControl) RegisterBatch(ctx context.Context, r messaging.RegisterBatchRequest) (messaging.RegisterBatchReply, error) {
	return messaging.RegisterEach(ctx, c.Register, r)
}

func (c *ownedControl) Reset(ctx context.Context, q messaging.ResetRequest) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := c.lookupFor(ctx, q.Dispatcher, q.Registration, "reset")
	return err
}

func (c *ownedControl) Remove(ctx context.Context, q messaging.RemoveRequest) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.lookupFor(ctx, q.Dispatcher, q.Registration, "remove"); err != nil {
		return err
	}
	delete(c.regs, q.Dispatcher)
	return nil
}

func (c *ownedControl) Heartbeat(ctx context.Context, q messaging.HeartbeatRequest) (messaging.HeartbeatReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	reply := messaging.HeartbeatReply{Codes: make([]messaging.Code, len(q.Checkpoints))}
	auth := messaging.AuthorityOf(ctx)
	for i, cp := range q.Checkpoints {
		r, ok := c.regs[cp.Dispatcher]
		switch {
		case ok && !messaging.MayServe(auth, r.target):
			reply.Codes[i] = messaging.CodePermissionDenied
		case !ok:
			reply.Codes[i] = messaging.CodeUnknownDispatcher
		case r.reg != cp.Registration:
			reply.Codes[i] = messaging.CodeStaleRegistration
		}
	}
	return reply, nil
}

// A refusal tells an identity nothing of another identity's dispatcher:
// identity A asking about B's dispatcher (with a wrong registration, and
// with B's own) gets exactly what it gets once that dispatcher does not
// exist at all, code and words, and no answer names B's registration. A
// Register of B's ID says the ID is taken, not by which registration.
func TestARefusalRevealsNothingOfAnotherIdentitysDispatcher(t *testing.T) {
	ca := tlstest.NewCA(t, t.TempDir(), "test")
	cp := &ownedControl{regs: map[common.DispatcherID]ownedReg{}}
	_, addr := serveTLS(t, ServerOptions{TLS: tlstest.ServerConfig(t, ca.Issue(t, "service", "service")),
		Policy: Policy{"collector-a": {"ca"}, "collector-b": {"cb"}}}, cp)
	client := func(name, id string, target messaging.Target) *Client {
		cli, err := NewClient(ClientOptions{Addr: addr, Target: target, TLS: tlstest.ClientConfig(t, ca.Issue(t, name, id))})
		require.NoError(t, err)
		require.NoError(t, cli.Start())
		t.Cleanup(cli.Close)
		return cli
	}
	a, b := client("a", "collector-a", "ca"), client("b", "collector-b", "cb")
	ctx := context.Background()

	const bReg, aGuess = messaging.RegistrationID(987654321), messaging.RegistrationID(5)
	d := common.DispatcherID{Hi: 77, Lo: 78}
	require.NoError(t, b.Register(ctx, messaging.RegisterRequest{Dispatcher: d, Registration: bReg, Span: common.TableSpan(1), Target: "cb"}))

	// What A learns by asking, as errors and heartbeat codes.
	ask := func() []string {
		var out []string
		for _, reg := range []messaging.RegistrationID{aGuess, bReg} {
			out = append(out,
				errText(a.Reset(ctx, messaging.ResetRequest{Dispatcher: d, Registration: reg, Epoch: 2, StartTs: 1})),
				errText(a.Remove(ctx, messaging.RemoveRequest{Dispatcher: d, Registration: reg})))
			reply, err := a.Heartbeat(ctx, messaging.HeartbeatRequest{Checkpoints: []messaging.DispatcherCheckpoint{
				{Dispatcher: d, Registration: reg, Epoch: 1, Ts: 1}}})
			require.NoError(t, err)
			out = append(out, fmt.Sprint(reply.Codes))
		}
		return out
	}
	whileBs := ask()
	for _, s := range whileBs[:3] { // asked with a wrong guess: B's registration is named nowhere
		require.NotContains(t, s, fmt.Sprint(bReg), "a refusal names B's registration")
		require.NotContains(t, s, fmt.Sprint(uint64(bReg)))
	}
	err := a.Register(ctx, messaging.RegisterRequest{Dispatcher: d, Registration: aGuess, Span: common.TableSpan(1), Target: "ca"})
	require.ErrorIs(t, err, messaging.ErrDispatcherExists, "dispatcher IDs are one namespace")
	require.NotContains(t, err.Error(), fmt.Sprint(bReg))
	err = a.Register(ctx, messaging.RegisterRequest{Dispatcher: d, Registration: aGuess, Span: common.TableSpan(1), Target: "ca", Replace: true})
	require.ErrorIs(t, err, messaging.ErrPermissionDenied)
	require.NotContains(t, err.Error(), fmt.Sprint(bReg))
	require.NotContains(t, err.Error(), `"cb"`, "nor B's target")

	require.NoError(t, b.Remove(ctx, messaging.RemoveRequest{Dispatcher: d, Registration: bReg}))
	whenNone := ask()
	require.Equal(t, whenNone, whileBs, "B's dispatcher and no dispatcher are refused alike")
	require.ErrorIs(t, a.Remove(ctx, messaging.RemoveRequest{Dispatcher: d, Registration: bReg}), messaging.ErrUnknownDispatcher)
}

func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	// The sentinel the code maps to, and the words.
	for _, s := range []error{messaging.ErrUnknownDispatcher, messaging.ErrStaleRegistration, messaging.ErrPermissionDenied} {
		if errors.Is(err, s) {
			return fmt.Sprintf("[%v] %v", s, err)
		}
	}
	return err.Error()
}
