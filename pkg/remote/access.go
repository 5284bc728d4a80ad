package remote

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sort"
	"strings"

	"go.uber.org/zap"
	"google.golang.org/grpc/credentials"
	grpcpeer "google.golang.org/grpc/peer"

	"github.com/cdcflow/eventservice/pkg/messaging"
)

// AnyTarget, in a Policy, lets an identity serve every target.
const AnyTarget messaging.Target = "*"

// Policy says which targets each collector identity may serve. An
// identity is a subject alternative name of the collector's verified
// client certificate: a DNS name, a URI or an e-mail address, as written
// in the certificate. A collector may open the data stream of a target,
// register dispatchers under it, and take over, reset, remove and
// heartbeat its registrations only if one of its certificate's identities
// lists the target (or AnyTarget). Everything else is refused with
// messaging.ErrPermissionDenied, on the stream as gRPC's PermissionDenied.
//
// A Policy needs TLS with verified client certificates: without TLS there
// is no identity, and the server accepts any peer for any target, which
// is why a plaintext server listens on loopback only (ServerOptions).
type Policy map[string][]messaging.Target

// ParsePolicy parses "identity=target+target,identity=target" (the form of
// cdcserver's --authorize flag); "*" as a target means any.
func ParsePolicy(s string) (Policy, error) {
	p := Policy{}
	for _, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		id, targets, ok := strings.Cut(entry, "=")
		if !ok || id == "" || targets == "" {
			return nil, fmt.Errorf("%w: policy entry %q: want identity=target[+target...]", messaging.ErrInvalidOptions, entry)
		}
		for _, t := range strings.Split(targets, "+") {
			p[id] = append(p[id], messaging.Target(t))
		}
	}
	return p, p.Validate()
}

// Validate reports every problem of p (no identity, an empty identity, an
// identity with no target, a target that fails messaging.Target.Validate),
// joined and wrapping messaging.ErrInvalidOptions.
func (p Policy) Validate() error {
	var errs []error
	if len(p) == 0 {
		errs = append(errs, errors.New("policy names no identity"))
	}
	for id, targets := range p {
		if id == "" {
			errs = append(errs, errors.New("policy: empty identity"))
		}
		if len(targets) == 0 {
			errs = append(errs, fmt.Errorf("policy: identity %q serves no target", id))
		}
		for _, t := range targets {
			if t == AnyTarget {
				continue
			}
			if err := t.Validate(); err != nil {
				errs = append(errs, fmt.Errorf("policy: identity %q: %w", id, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", messaging.ErrInvalidOptions, err)
	}
	return nil
}

// grant is what one identity may serve.
type grant struct {
	any     bool
	targets map[messaging.Target]struct{}
}

func (p Policy) grants() map[string]grant {
	out := make(map[string]grant, len(p))
	for id, targets := range p {
		g := grant{targets: map[messaging.Target]struct{}{}}
		for _, t := range targets {
			if t == AnyTarget {
				g.any = true
			}
			g.targets[t] = struct{}{}
		}
		out[id] = g
	}
	return out
}

// authority is a peer's messaging.Authority: the union of the grants of
// its certificate's identities.
type authority struct {
	identity string
	grants   []grant
}

func (a *authority) Identity() string { return a.identity }

func (a *authority) MayServe(t messaging.Target) bool {
	for _, g := range a.grants {
		if _, ok := g.targets[t]; g.any || ok {
			return true
		}
	}
	return false
}

// identities lists a certificate's names that a Policy may use, in a
// stable order.
func identities(c *x509.Certificate) []string {
	ids := append([]string(nil), c.DNSNames...)
	for _, u := range c.URIs {
		ids = append(ids, u.String())
	}
	ids = append(ids, c.EmailAddresses...)
	sort.Strings(ids)
	return ids
}

// authorityOf derives the caller's authority from its connection: nil
// (unrestricted) when the server has no Policy; otherwise what the
// identities of its verified certificate are granted, which is nothing
// for a peer without one.
func (s *Server) authorityOf(ctx context.Context) messaging.Authority {
	if s.grants == nil {
		return nil
	}
	a := &authority{identity: "(no verified certificate)"}
	p, ok := grpcpeer.FromContext(ctx)
	if !ok {
		return a
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return a
	}
	ids := identities(info.State.VerifiedChains[0][0])
	if len(ids) > 0 {
		a.identity = strings.Join(ids, "|")
	} else {
		a.identity = "(certificate without a SAN)"
	}
	for _, id := range ids {
		if g, ok := s.grants[id]; ok {
			a.grants = append(a.grants, g)
		}
	}
	return a
}

// guardTLS returns cfg checking, at the end of each handshake, that the
// peer's verified certificate has an identity the Policy grants
// something: a peer the Policy does not know cannot hold a connection, or
// a stream waiting for its hello, past its handshake. A configuration
// supplied per handshake (GetConfigForClient) gets the same check.
func (s *Server) guardTLS(cfg *tls.Config) *tls.Config {
	cfg = cfg.Clone()
	cfg.VerifyConnection = s.knownPeer(cfg.VerifyConnection)
	if get := cfg.GetConfigForClient; get != nil {
		cfg.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			c, err := get(h)
			if c == nil || err != nil {
				return c, err
			}
			c = c.Clone()
			c.VerifyConnection = s.knownPeer(c.VerifyConnection)
			return c, nil
		}
	}
	return cfg
}

// knownPeer runs next, then refuses a peer none of whose identities the
// Policy names.
func (s *Server) knownPeer(next func(tls.ConnectionState) error) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if next != nil {
			if err := next(cs); err != nil {
				return err
			}
		}
		if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
			s.met.refusedCalls.WithLabelValues("permission_denied").Inc()
			return errors.New("remote: no verified client certificate")
		}
		ids := identities(cs.VerifiedChains[0][0])
		for _, id := range ids {
			if _, ok := s.grants[id]; ok {
				return nil
			}
		}
		s.met.refusedCalls.WithLabelValues("permission_denied").Inc()
		s.log.Warn("client certificate refused: the policy grants none of its identities", zap.Strings("identities", ids))
		return fmt.Errorf("remote: the policy grants none of the certificate's identities %q", ids)
	}
}
