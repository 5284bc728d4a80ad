package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/internal/tlstest"
)

// The API over mutual TLS with a token: the cli with the CA, a client
// certificate and the token lists the nodes; without the token it is
// refused (401, exit 1), without a client certificate it reaches no node
// (exit 2); /healthz needs no token. An address that holds maxConnsPerIP
// connections (which never start a handshake) has one more closed on
// accept, while another address still gets in.
func TestTheAPIWantsItsTokenOverMutualTLSAndBoundsEachAddress(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "api")
	srv, cli := ca.Issue(t, "node", "node"), ca.Issue(t, "operator", "operator")
	token := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(token, []byte("s3cret\n"), 0o600))
	n, _ := launchNode(t, "n1", "", func(c *Config) {
		c.APITokenFile, c.APITLSCert, c.APITLSKey, c.APITLSCA = token, srv.Cert, srv.Key, srv.CA
	})
	defer func() {
		n.stop()
		require.NoError(t, <-n.done, n.stderr.String())
	}()
	ctx := context.Background()
	cliRun := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := CLI(ctx, append([]string{"--server", "https://" + n.addr}, args...), &out, &errOut)
		return code, out.String() + errOut.String()
	}
	full := []string{"--ca", cli.CA, "--cert", cli.Cert, "--key", cli.Key, "--token-file", token}
	testwait.Within(t, time.Minute, "the node serving", func() bool { code, _ := cliRun(append(full, "node", "list")...); return code == 0 })
	code, out := cliRun(append(full, "node", "list")...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `"id": "n1"`)

	code, out = cliRun("--ca", cli.CA, "--cert", cli.Cert, "--key", cli.Key, "node", "list")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "401")
	code, out = cliRun("--ca", cli.CA, "--token-file", token, "node", "list")
	require.Equal(t, 2, code, "no client certificate: "+out)

	// An address's connections bounded: maxConnsPerIP idle ones from
	// 127.0.0.1 (held until the test ends), then one more is closed.
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for range maxConnsPerIP {
		c, err := net.Dial("tcp", n.addr)
		require.NoError(t, err)
		idle = append(idle, c)
	}
	extra, err := net.Dial("tcp", n.addr)
	require.NoError(t, err)
	defer extra.Close()
	require.NoError(t, extra.SetReadDeadline(time.Now().Add(time.Minute)))
	_, err = extra.Read(make([]byte, 1))
	var ne net.Error
	require.Error(t, err, "closed on accept")
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "closed on accept, not left waiting: %v", err)
	// Another address gets in: a call from 127.0.0.2 is answered.
	tr, err := cliTransport(cli.CA, cli.Cert, cli.Key)
	require.NoError(t, err)
	tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Get("https://" + n.addr + "/healthz")
	require.NoError(t, err, "another address gets in")
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// Bodies that do not read are refused with 400 and change nothing: not
// JSON, an unknown field, a body over 1 MiB, a name that cannot be one, a
// configuration without its databases.
func TestTheAPIRefusesBodiesThatDoNotRead(t *testing.T) {
	n, _ := startNode(t, "n1", "")
	defer func() {
		n.stop()
		require.NoError(t, <-n.done, n.stderr.String())
	}()
	post := func(body []byte) int {
		resp, err := http.Post("http://"+n.addr+"/api/v1/changefeeds", "application/json", bytes.NewReader(body))
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusBadRequest, post([]byte("{not json")))
	require.Equal(t, http.StatusBadRequest, post([]byte(`{"name":"a","config":{"source":"postgres://h/d","sink":"postgres://h/e"},"extra":1}`)))
	require.Equal(t, http.StatusBadRequest, post(append([]byte(`{"name":"`), bytes.Repeat([]byte("a"), 2<<20)...)))
	require.Equal(t, http.StatusBadRequest, post([]byte(`{"name":"../x","config":{"source":"postgres://h/d","sink":"postgres://h/e"}}`)))
	require.Equal(t, http.StatusBadRequest, post([]byte(`{"name":"a","config":{}}`)))
	var list []json.RawMessage
	require.Equal(t, http.StatusOK, n.call(t, "GET", "/api/v1/changefeeds", nil, &list))
	require.Empty(t, list, "nothing created")
}
