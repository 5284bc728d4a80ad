package remote

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/internal/tlstest"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// authorityRecorder is a control plane that refuses what the caller's
// authority does not allow, as the event service does (the edge under
// test: what the server attaches to a call's context).
type authorityRecorder struct{ seen chan messaging.Authority }

func (a *authorityRecorder) check(ctx context.Context, target messaging.Target) error {
	auth := messaging.AuthorityOf(ctx)
	a.seen <- auth
	if !messaging.MayServe(auth, target) {
		return messaging.ErrPermissionDenied
	}
	return nil
}
func (a *authorityRecorder) Register(ctx context.Context, r messaging.RegisterRequest) error {
	return a.check(ctx, r.Target)
}
func (a *authorityRecorder) Reset(ctx context.Context, _ messaging.ResetRequest) error { return nil }
func (a *authorityRecorder) Remove(ctx context.Context, _ messaging.RemoveRequest) error {
	return nil
}
func (a *authorityRecorder) RegisterBatch(ctx context.Context, r messaging.RegisterBatchRequest) (messaging.RegisterBatchReply, error) {
	return messaging.RegisterEach(ctx, a.Register, r)
}

func (a *authorityRecorder) Heartbeat(context.Context, messaging.HeartbeatRequest) (messaging.HeartbeatReply, error) {
	return messaging.HeartbeatReply{}, nil
}

func serveTLS(t *testing.T, tlsOpts ServerOptions, cp messaging.ControlPlane) (*Server, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := NewServer(tlsOpts)
	require.NoError(t, err)
	require.NoError(t, srv.Start(lis, cp))
	t.Cleanup(srv.Close)
	return srv, lis.Addr().String()
}

// With mutual TLS, a certificate's identity serves only the targets the
// Policy grants it: another identity's stream for the target is refused
// and the owner's stream is untouched; its control calls carry its
// authority, and ErrPermissionDenied comes back as itself.
func TestPolicyLetsAnIdentityServeOnlyItsTargets(t *testing.T) {
	ca := tlstest.NewCA(t, t.TempDir(), "test")
	service := ca.Issue(t, "service", "service")
	one, two := ca.Issue(t, "one", "collector-1"), ca.Issue(t, "two", "collector-2")
	cp := &authorityRecorder{seen: make(chan messaging.Authority, 8)}
	srv, addr := serveTLS(t, ServerOptions{TLS: tlstest.ServerConfig(t, service),
		Policy: Policy{"collector-1": {"c1"}, "collector-2": {"c2"}}}, cp)

	owner, err := NewClient(ClientOptions{Addr: addr, Target: "c1", Capacity: 16, TLS: tlstest.ClientConfig(t, one)})
	require.NoError(t, err)
	require.NoError(t, owner.Start())
	defer owner.Close()
	waitConnected(t, srv, "c1")

	thief, err := NewClient(ClientOptions{Addr: addr, Target: "c1", Capacity: 16, TLS: tlstest.ClientConfig(t, two)})
	require.NoError(t, err)
	require.NoError(t, thief.Start())
	defer thief.Close()
	testwait.For(t, "the thief's stream is refused", func() bool {
		return testutil.ToFloat64(srv.met.refusedCalls.WithLabelValues("permission_denied")) >= 1
	})
	require.Zero(t, thief.Streams(), "a refused hello opens no stream")
	require.NoError(t, srv.Send("c1", sampleMessages()[:1]))
	require.Equal(t, sampleMessages()[:1], receive(t, owner.Inbox(), 1), "the owner's stream still delivers")
	require.Equal(t, int64(1), owner.Streams(), "and was never replaced")

	ctx := context.Background()
	req := messaging.RegisterRequest{Dispatcher: disp, Registration: 9, Span: common.TableSpan(1), Target: "c1", Replace: true}
	require.ErrorIs(t, thief.Register(ctx, req), messaging.ErrPermissionDenied)
	auth := <-cp.seen
	require.Equal(t, "collector-2", auth.Identity())
	require.False(t, auth.MayServe("c1"))
	require.True(t, auth.MayServe("c2"))
	require.NoError(t, owner.Register(ctx, req))
	require.Equal(t, "collector-1", (<-cp.seen).Identity())
}

// Certificates are read again when their files change: after the
// service's files are rotated to another CA, a new connection needs the
// new CA, without a restart.
func TestCertificatesAreReloadedWhenTheirFilesChange(t *testing.T) {
	dir := t.TempDir()
	oldCA, newCA := tlstest.NewCA(t, dir, "old"), tlstest.NewCA(t, dir, "new")
	svcOld, svcNew := oldCA.Issue(t, "svc-old", "service"), newCA.Issue(t, "svc-new", "service")
	cliOld, cliNew := oldCA.Issue(t, "cli-old", "collector-1"), newCA.Issue(t, "cli-new", "collector-1")
	live := tlstest.Files{CA: dir + "/live-ca.pem", Cert: dir + "/live.pem", Key: dir + "/live-key.pem"}
	install := func(f tlstest.Files) {
		for src, dst := range map[string]string{f.CA: live.CA, f.Cert: live.Cert, f.Key: live.Key} {
			b, err := os.ReadFile(src)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(dst, b, 0o600))
		}
	}
	install(svcOld)
	files, err := NewTLSFiles(live.Cert, live.Key, live.CA, nil)
	require.NoError(t, err)
	_, addr := serveTLS(t, ServerOptions{TLS: files.ServerConfig(), Policy: Policy{"collector-1": {AnyTarget}}},
		&authorityRecorder{seen: make(chan messaging.Authority, 8)})
	call := func(f tlstest.Files) error {
		cf, err := NewTLSFiles(f.Cert, f.Key, f.CA, nil)
		require.NoError(t, err)
		cli, err := NewClient(ClientOptions{Addr: addr, Target: "c1", TLS: cf.ClientConfig("127.0.0.1"), CallTimeout: 5 * time.Second})
		require.NoError(t, err)
		require.NoError(t, cli.Start())
		defer cli.Close()
		return cli.Remove(context.Background(), messaging.RemoveRequest{Dispatcher: disp, Registration: 7})
	}
	require.NoError(t, call(cliOld))
	require.ErrorIs(t, call(cliNew), messaging.ErrUnavailable, "the new CA is not trusted yet")
	install(svcNew)
	require.NoError(t, call(cliNew), "rotated without a restart")
	require.ErrorIs(t, call(cliOld), messaging.ErrUnavailable, "the old CA is no longer trusted")

	require.NoError(t, os.WriteFile(live.Cert, []byte("torn"), 0o600))
	require.NoError(t, call(cliNew), "files caught mid-rotation: the last good ones are kept")
}

// A certificate the CA signed but whose identities the Policy does not
// name (no SAN but an IP address, or an unknown name) does not get past
// the handshake: it can hold no connection and no stream slot.
func TestACertificateThePolicyDoesNotKnowIsRefusedAtTheHandshake(t *testing.T) {
	ca := tlstest.NewCA(t, t.TempDir(), "test")
	srv, addr := serveTLS(t, ServerOptions{TLS: tlstest.ServerConfig(t, ca.Issue(t, "service", "service")),
		Policy: Policy{"collector-1": {"c1"}}}, &authorityRecorder{seen: make(chan messaging.Authority, 8)})
	for _, f := range []tlstest.Files{ca.Issue(t, "ip-only"), ca.Issue(t, "stranger", "collector-9")} {
		cli, err := NewClient(ClientOptions{Addr: addr, Target: "c1", TLS: tlstest.ClientConfig(t, f), CallTimeout: 5 * time.Second})
		require.NoError(t, err)
		require.NoError(t, cli.Start())
		err = cli.Remove(context.Background(), messaging.RemoveRequest{Dispatcher: disp, Registration: 7})
		cli.Close()
		require.ErrorIs(t, err, messaging.ErrUnavailable, "%s: refused at the handshake", f.Cert)
	}
	testwait.For(t, "no connection is left open", func() bool { return srv.conns.count() == 0 })
	require.GreaterOrEqual(t, testutil.ToFloat64(srv.met.refusedCalls.WithLabelValues("permission_denied")), 2.0)
	require.Zero(t, srv.Connected())
}
