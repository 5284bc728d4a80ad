package synthetic

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"strings"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/remote"
)

// tlsFiles reads the certificate, key and CA of cfg, re-read at each
// handshake when they change (remote.TLSFiles); nil when TLS is off.
func tlsFiles(cfg Config, lg *zap.Logger) (*remote.TLSFiles, error) {
	if cfg.TLSCert == "" {
		return nil, nil
	}
	f, err := remote.NewTLSFiles(cfg.TLSCert, cfg.TLSKey, cfg.TLSCA, lg)
	if err != nil {
		return nil, fmt.Errorf("%w: --tls-cert/--tls-key/--tls-ca: %w", ErrInvalidConfig, err)
	}
	return f, nil
}

// serverTLS is the service's side of mutual TLS: its certificate, and
// collectors must present one signed by the CA. nil when TLS is off.
func serverTLS(cfg Config, lg *zap.Logger) (*tls.Config, error) {
	f, err := tlsFiles(cfg, lg)
	if f == nil || err != nil {
		return nil, err
	}
	return f.ServerConfig(), nil
}

// clientTLS is a collector's side: its certificate, and the service's
// must be signed by the CA for the host it connects to. nil when TLS is
// off.
func clientTLS(cfg Config, lg *zap.Logger) (*tls.Config, error) {
	f, err := tlsFiles(cfg, lg)
	if f == nil || err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(cfg.Connect)
	if err != nil {
		return nil, fmt.Errorf("%w: --connect=%q: %w", ErrInvalidConfig, cfg.Connect, err)
	}
	if host == "" {
		return nil, fmt.Errorf("%w: --connect=%q names no host to check the service's certificate against", ErrInvalidConfig, cfg.Connect)
	}
	return f.ClientConfig(host), nil
}

// servicePolicy is what each collector identity may serve: --authorize,
// or, for the collector processes --remote-collectors starts (which
// present the service's own certificate), every target for the
// identities of that certificate. nil when TLS is off.
func servicePolicy(cfg Config) (remote.Policy, error) {
	if cfg.TLSCert == "" {
		return nil, nil
	}
	if cfg.Authorize != "" {
		p, err := remote.ParsePolicy(cfg.Authorize)
		if err != nil {
			return nil, fmt.Errorf("%w: --authorize=%q: %w", ErrInvalidConfig, cfg.Authorize, err)
		}
		return p, nil
	}
	if cfg.RemoteCollectors == 0 {
		return nil, fmt.Errorf("%w: --tls-cert on the service needs --authorize (which certificate identity serves which changefeed)", ErrInvalidConfig)
	}
	cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("%w: --tls-cert/--tls-key: %w", ErrInvalidConfig, err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("%w: --tls-cert: %w", ErrInvalidConfig, err)
	}
	p := remote.Policy{}
	for _, id := range append(append(leaf.DNSNames, leaf.EmailAddresses...), uriStrings(leaf)...) {
		p[id] = []messaging.Target{remote.AnyTarget}
	}
	if len(p) == 0 {
		return nil, fmt.Errorf("%w: --tls-cert has no DNS, URI or e-mail SAN to authorize its collector processes by; give --authorize", ErrInvalidConfig)
	}
	return p, nil
}

func uriStrings(c *x509.Certificate) []string {
	out := make([]string, len(c.URIs))
	for i, u := range c.URIs {
		out[i] = u.String()
	}
	return out
}

// describePolicy is a policy for a log line.
func describePolicy(p remote.Policy) string {
	var parts []string
	for id, ts := range p {
		names := make([]string, len(ts))
		for i, t := range ts {
			names[i] = string(t)
		}
		parts = append(parts, id+"="+strings.Join(names, "+"))
	}
	return strings.Join(parts, ",")
}
