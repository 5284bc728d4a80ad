package node

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/exitcode"
)

// CLI is `cdcserver cli`: it drives a node's HTTP API (any node answers
// for the cluster) and prints its replies as JSON. Exit 0: done; 1: the
// API refused or failed (its error printed); 2: bad arguments, or no node
// reached.
func CLI(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cdcserver cli", flag.ContinueOnError)
	fs.SetOutput(stderr)
	server := fs.String("server", "http://127.0.0.1:8300", "a node's API address")
	timeout := fs.Duration("timeout", 3*time.Minute, "bound on one call (remove waits for the changefeed to leave its node)")
	tokenFile := fs.String("token-file", "", "file holding the API's token (the nodes' --api-token-file)")
	caFile := fs.String("ca", "", "PEM CA that signed the nodes' API certificate (https)")
	certFile := fs.String("cert", "", "PEM client certificate, for nodes that require one (--api-tls-ca)")
	keyFile := fs.String("key", "", "PEM key of --cert")
	fs.Usage = func() { cliUsage(fs) }
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return exitcode.OK
		}
		return exitcode.Setup
	}
	rest := fs.Args()
	if len(rest) < 2 {
		cliUsage(fs)
		return exitcode.Setup
	}
	tr, err := cliTransport(*caFile, *certFile, *keyFile)
	if err != nil {
		fmt.Fprintf(stderr, "cdcserver cli: %v\n", err)
		return exitcode.Setup
	}
	c := &cliClient{base: strings.TrimRight(*server, "/"), stdout: stdout, stderr: stderr, http: &http.Client{Timeout: *timeout, Transport: tr}}
	if *tokenFile != "" {
		if c.token, err = readToken(*tokenFile); err != nil {
			fmt.Fprintf(stderr, "cdcserver cli: --token-file: %v\n", err)
			return exitcode.Setup
		}
	}
	switch rest[0] + " " + rest[1] {
	case "changefeed create", "changefeed update":
		return c.createOrUpdate(ctx, rest[1], rest[2:])
	case "changefeed list":
		return c.do(ctx, "GET", "/api/v1/changefeeds", nil)
	case "node list":
		return c.do(ctx, "GET", "/api/v1/nodes", nil)
	}
	if len(rest) != 3 {
		cliUsage(fs)
		return exitcode.Setup
	}
	name := rest[2]
	switch rest[0] + " " + rest[1] {
	case "changefeed query":
		return c.do(ctx, "GET", "/api/v1/changefeeds/"+name, nil)
	case "changefeed pause", "changefeed resume":
		return c.do(ctx, "POST", "/api/v1/changefeeds/"+name+"/"+rest[1], nil)
	case "changefeed remove":
		return c.do(ctx, "DELETE", "/api/v1/changefeeds/"+name, nil)
	case "node drain":
		return c.do(ctx, "POST", "/api/v1/nodes/"+name+"/drain", nil)
	}
	cliUsage(fs)
	return exitcode.Setup
}

func cliUsage(fs *flag.FlagSet) {
	fmt.Fprintf(fs.Output(), `usage: cdcserver cli [--server URL] COMMAND

Drives a cluster through any node's API (cdcserver server) and prints its replies as JSON.

Commands:
  changefeed create NAME --source DSN --sink DSN [options]   create a changefeed (running unless --paused)
  changefeed update NAME --source DSN --sink DSN [options]   change a paused changefeed's configuration
  changefeed list                                            every changefeed, its state and node
  changefeed query NAME                                      one changefeed: where it runs, its moves, its status
  changefeed pause NAME                                      stop it everywhere and release its slot's walsender
  changefeed resume NAME                                     place it on a node again
  changefeed remove NAME                                     stop it, drop its slot (and publication if made), its keys
  node list                                                  the live nodes, the coordinator, their changefeeds
  node drain ID                                              move a node's changefeeds off it

A DSN never holds a password (it would be stored in etcd in clear): use passfile=/path (a file on the nodes)
or --source-password-env/--sink-password-env (an environment variable of the nodes named CDCFLOW_PASSWORD_...),
or service=NAME (a libpq service each node resolves from its own PGSERVICEFILE).
Exit 0: done; 1: the API refused or failed; 2: bad arguments or no node reached.

Flags:
`)
	fs.PrintDefaults()
}

type cliClient struct {
	base           string
	token          string
	stdout, stderr io.Writer
	http           *http.Client
}

// createOrUpdate is changefeed create|update NAME [options].
func (c *cliClient) createOrUpdate(ctx context.Context, verb string, args []string) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(c.stderr, "cdcserver cli: changefeed %s NAME [options]\n", verb)
		return exitcode.Setup
	}
	name := args[0]
	fs := flag.NewFlagSet("cdcserver cli changefeed "+verb, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	var cfg ChangefeedConfig
	var include, exclude string
	paused := false
	fs.StringVar(&cfg.Source, "source", "", "the source database's DSN (no password)")
	fs.StringVar(&cfg.Sink, "sink", "", "the target database's DSN (no password)")
	fs.StringVar(&cfg.Slot, "slot", "", "the slot (default: the changefeed's name)")
	fs.StringVar(&cfg.Publication, "publication", "", "the publication (default: the changefeed's name)")
	fs.StringVar(&include, "include", "", "schema.table globs to replicate, comma-separated")
	fs.StringVar(&exclude, "exclude", "", "schema.table globs to leave out, comma-separated")
	fs.IntVar(&cfg.SinkWorkers, "sink-workers", 0, "serve's --sink-workers (0: its default)")
	fs.Int64Var(&cfg.MaxRetainedWAL, "max-retained-wal", 0, "serve's --max-retained-wal in bytes (0: its default, -1: none)")
	fs.BoolVar(&cfg.NoDDLCapture, "no-ddl-capture", false, "serve's --no-ddl-capture")
	fs.StringVar(&cfg.SourcePasswordEnv, "source-password-env", "", "an environment variable of the nodes holding the source's password, named CDCFLOW_PASSWORD_...")
	fs.StringVar(&cfg.SinkPasswordEnv, "sink-password-env", "", "an environment variable of the nodes holding the target's password, named CDCFLOW_PASSWORD_...")
	if verb == "create" {
		fs.BoolVar(&paused, "paused", false, "create it paused")
	}
	if err := fs.Parse(args[1:]); err != nil {
		return exitcode.Setup
	}
	for _, p := range []struct {
		s   string
		out *[]string
	}{{include, &cfg.Include}, {exclude, &cfg.Exclude}} {
		for _, g := range strings.Split(p.s, ",") {
			if g = strings.TrimSpace(g); g != "" {
				*p.out = append(*p.out, g)
			}
		}
	}
	if verb == "create" {
		return c.do(ctx, "POST", "/api/v1/changefeeds", createRequest{Name: name, Config: cfg, Paused: paused})
	}
	return c.do(ctx, "PUT", "/api/v1/changefeeds/"+name, cfg)
}

// cliTransport trusts ca for the nodes' API (its system's roots without)
// and presents cert and key when given.
func cliTransport(ca, cert, key string) (*http.Transport, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if ca == "" && cert == "" {
		return tr, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pool, err := certPool(ca)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	tr.TLSClientConfig = cfg
	return tr, nil
}

// do calls the API and prints its reply.
func (c *cliClient) do(ctx context.Context, method, path string, body any) int {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			fmt.Fprintf(c.stderr, "cdcserver cli: %v\n", err)
			return exitcode.Setup
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, r)
	if err != nil {
		fmt.Fprintf(c.stderr, "cdcserver cli: %v\n", err)
		return exitcode.Setup
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		fmt.Fprintf(c.stderr, "cdcserver cli: no node reached at %s: %v\n", c.base, err)
		return exitcode.Setup
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		fmt.Fprintf(c.stderr, "cdcserver cli: %v\n", err)
		return exitcode.Failed
	}
	if resp.StatusCode >= 300 {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			fmt.Fprintf(c.stderr, "cdcserver cli: %s (%s)\n", e.Error, resp.Status)
		} else {
			fmt.Fprintf(c.stderr, "cdcserver cli: %s\n", resp.Status)
		}
		return exitcode.Failed
	}
	_, _ = c.stdout.Write(b)
	return exitcode.OK
}
