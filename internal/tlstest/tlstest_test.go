package tlstest

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A certificate the CA issued carries its names and verifies against the
// CA; one of another CA does not.
func TestIssuedCertificatesVerifyAgainstTheirCA(t *testing.T) {
	dir := t.TempDir()
	ca := NewCA(t, dir, "a")
	f := ca.Issue(t, "leaf", "collector-1")
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	require.NoError(t, err)
	require.Equal(t, []string{"collector-1"}, leaf.DNSNames)
	require.True(t, leaf.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)))
	pool := ServerConfig(t, f).ClientCAs
	_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err)
	other := NewCA(t, dir, "b")
	_, err = leaf.Verify(x509.VerifyOptions{Roots: ServerConfig(t, other.Issue(t, "x")).ClientCAs})
	require.Error(t, err)
}
