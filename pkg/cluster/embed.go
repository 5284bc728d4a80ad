package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// ErrEmbeddedEtcd is an embedded etcd member that did not start or serve.
var ErrEmbeddedEtcd = errors.New("cluster: embedded etcd")

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
	// (one member: a cluster of one).
	Cluster []EmbeddedMember
	// Token names the cluster, so that members of another are refused.
	Token string
	// ReadyTimeout bounds the wait for the member to serve (default 60s:
	// a member of several waits for a quorum).
	ReadyTimeout time.Duration
	// Logger for etcd's own logs (default: none).
	Logger *zap.Logger
}

// StartEmbedded starts an etcd member and waits until it serves clients
// (a member of several: until the cluster has a quorum). Close stops it.
func StartEmbedded(ctx context.Context, opts EmbeddedOptions) (*embed.Etcd, error) {
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
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	if opts.Logger != nil {
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(opts.Logger)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: start %s: %w", ErrEmbeddedEtcd, opts.Member.Name, err)
	}
	wait := opts.ReadyTimeout
	if wait == 0 {
		wait = time.Minute
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("%w: %s: %w", ErrEmbeddedEtcd, opts.Member.Name, err)
	case <-t.C:
		e.Close()
		return nil, fmt.Errorf("%w: %s not ready within %v", ErrEmbeddedEtcd, opts.Member.Name, wait)
	case <-ctx.Done():
		e.Close()
		return nil, ctx.Err()
	}
}
