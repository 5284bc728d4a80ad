package cluster

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/optcheck"
	"github.com/cdcflow/eventservice/pkg/clock"
)

// EmbeddedMember is one member of an etcd cluster run inside this process:
// the one-machine default of a node started without --etcd (a single
// member in its data directory), and the tests' three-member clusters.
type EmbeddedMember struct {
	// Name names the member in the cluster.
	Name string
	// Dir is its data directory.
	Dir string
	// ClientURL and PeerURL are where it listens (http://127.0.0.1:port).
	ClientURL, PeerURL string
}

// EmbeddedOptions start one member of an embedded cluster.
type EmbeddedOptions struct {
	Member EmbeddedMember
	// Cluster is every member of the initial cluster, this one included
	// (default: this member alone, a cluster of one).
	Cluster []EmbeddedMember
	// Token names the cluster, so that members of another are refused.
	Token string
	// ReadyTimeout bounds the wait for the member to serve (default 1m:
	// a member of several waits for a quorum).
	ReadyTimeout time.Duration
	// Logger for etcd's own logs (default: none).
	Logger *zap.Logger
}

// EnsureDefaults returns a copy of o with every zero field set to its
// documented default.
func (o EmbeddedOptions) EnsureDefaults() EmbeddedOptions {
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = time.Minute
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if len(o.Cluster) == 0 {
		o.Cluster = []EmbeddedMember{o.Member}
	}
	return o
}

// Validate reports what is wrong with o (after EnsureDefaults).
func (o EmbeddedOptions) Validate() error {
	p := optcheck.New(ErrInvalidOptions)
	p.Require(o.Member.Name != "" && o.Member.Dir != "", "EmbeddedOptions.Member needs a name and a directory")
	p.Require(o.Member.ClientURL != "" && o.Member.PeerURL != "", "EmbeddedOptions.Member needs a client and a peer URL")
	p.Require(o.ReadyTimeout > 0, "EmbeddedOptions.ReadyTimeout %v is not positive", o.ReadyTimeout)
	return p.Err()
}

// StartEmbedded starts an etcd member and waits until it serves clients
// (a member of several: until the cluster has a quorum). Close stops it.
func StartEmbedded(ctx context.Context, opts EmbeddedOptions) (*embed.Etcd, error) {
	opts = opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = opts.Member.Name
	cfg.Dir = opts.Member.Dir
	urls := func(s string) ([]url.URL, error) {
		u, err := url.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("%w: %q: %w", ErrEmbeddedEtcd, s, err)
		}
		return []url.URL{*u}, nil
	}
	var err error
	if cfg.ListenClientUrls, err = urls(opts.Member.ClientURL); err != nil {
		return nil, err
	}
	cfg.AdvertiseClientUrls = cfg.ListenClientUrls
	if cfg.ListenPeerUrls, err = urls(opts.Member.PeerURL); err != nil {
		return nil, err
	}
	cfg.AdvertisePeerUrls = cfg.ListenPeerUrls
	var initial []string
	for _, m := range opts.Cluster {
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	cfg.InitialCluster = strings.Join(initial, ",")
	cfg.InitialClusterToken = opts.Token
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(opts.Logger)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: start %s: %w", ErrEmbeddedEtcd, opts.Member.Name, err)
	}
	ctx, cancel := context.WithDeadline(ctx, clock.RealDeadline(opts.ReadyTimeout))
	defer cancel()
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("%w: %s: %w", ErrEmbeddedEtcd, opts.Member.Name, err)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("%w: %s not ready within %v: %w", ErrEmbeddedEtcd, opts.Member.Name, opts.ReadyTimeout, ctx.Err())
	}
}
