package node

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/goruntime"
	"github.com/cdcflow/eventservice/internal/optcheck"
	"github.com/cdcflow/eventservice/pkg/pgsink"
)

// ErrInvalidConfig wraps every configuration error of a node.
var ErrInvalidConfig = errors.New("invalid configuration")

// Config is `cdcserver server`'s configuration; each exported field is
// one flag.
type Config struct {
	// Cluster names the cluster: its keys' root in etcd.
	Cluster string
	// NodeID names this node (default: host name and API port).
	NodeID string
	// Addr serves the HTTP API, /metrics, /healthz and /readyz.
	Addr string
	// DataDir holds the embedded etcd member's data and each changefeed's
	// event store.
	DataDir string
	// Etcd are the etcd cluster's client URLs ("": an embedded
	// single-member etcd in DataDir, listening on EtcdClientAddr and
	// EtcdPeerAddr).
	Etcd                         string
	EtcdClientAddr, EtcdPeerAddr string
	// EtcdCA, EtcdCert and EtcdKey are PEM files for TLS to etcd (all
	// empty: plain TCP).
	EtcdCA, EtcdCert, EtcdKey string
	// APITokenFile holds the token every /api/ call must bear ("": none).
	APITokenFile string
	// APITLSCert and APITLSKey serve the API over HTTPS; APITLSCA also
	// requires clients' certificates signed by it.
	APITLSCert, APITLSKey, APITLSCA string
	// LeaseTTL is the node's lease TTL.
	LeaseTTL time.Duration
	// BalanceInterval is how often the coordinator may move changefeeds
	// only to even the load (one a round).
	BalanceInterval time.Duration
	// DrainTimeout bounds a SIGTERM's hand-off of the node's changefeeds.
	DrainTimeout time.Duration
	// StoreCacheSize is the block cache the event stores of every
	// changefeed of the node share, in bytes; StoreMemTableSize is each
	// store's memtable size (an embedded run's store is a cache: the slot
	// is the durable log).
	StoreCacheSize, StoreMemTableSize int64
	// SinkQueueSize is every changefeed's --sink-queue-size: the bytes of
	// rows its sink holds in memory (pgsink.Options.QueueBytes).
	SinkQueueSize int64
	// Settings are the Go runtime's (--gc-percent, --max-procs,
	// --memory-limit) while the node runs; a set environment variable
	// wins. The Go heap's limit beside the event stores', which live
	// outside it (StoreCacheSize).
	goruntime.Settings
	// PprofAddr serves /debug/pprof on a loopback address ("": none).
	PprofAddr string
	LogLevel  string
	LogFormat string
}

// The event stores' memory: one block cache shared by a node's
// changefeeds, and a memtable per changefeed (TiCDC's event store's
// memtable is 8 MiB too). docs/benchmarks.md ("A node's memory per
// changefeed") measured what they bound.
const (
	DefaultStoreCacheSize    = 128 << 20
	DefaultStoreMemTableSize = 8 << 20
	// minStoreSize is the least of either; maxStoreMemTableSize the
	// most of a memtable (eventstore.Options.MemTableBytes allows no more).
	minStoreSize         = 1 << 20
	maxStoreMemTableSize = 4 << 30
	// minSinkQueueSize is the least --sink-queue-size: 64 KiB for each of
	// the 256 lanes a changefeed's sink_workers may ask for.
	minSinkQueueSize = 256 * pgsink.MinLaneQueueBytes
)

// DefaultConfig returns the server's defaults.
func DefaultConfig() Config {
	return Config{Cluster: "default", Addr: "127.0.0.1:8300", EtcdClientAddr: "127.0.0.1:2379", EtcdPeerAddr: "127.0.0.1:2380",
		LeaseTTL: 10 * time.Second, BalanceInterval: 15 * time.Second, DrainTimeout: time.Minute, StoreCacheSize: DefaultStoreCacheSize,
		StoreMemTableSize: DefaultStoreMemTableSize, SinkQueueSize: pgsink.DefaultQueueBytes, LogLevel: "info", LogFormat: "text"}
}

// BindFlags binds c's fields to fs's flags.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Cluster, "cluster", c.Cluster, "the cluster's name (its keys' root in etcd)")
	fs.StringVar(&c.NodeID, "node-id", c.NodeID, "this node's ID (default: host name:API port)")
	fs.StringVar(&c.Addr, "addr", c.Addr, "address serving the HTTP API, /metrics, /healthz and /readyz")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for the embedded etcd's data and the changefeeds' event stores (required)")
	fs.StringVar(&c.Etcd, "etcd", c.Etcd, "the etcd cluster's client URLs, comma-separated (empty: an embedded single-member etcd in --data-dir)")
	fs.StringVar(&c.EtcdClientAddr, "etcd-client-addr", c.EtcdClientAddr, "the embedded etcd's client address (without --etcd)")
	fs.StringVar(&c.EtcdPeerAddr, "etcd-peer-addr", c.EtcdPeerAddr, "the embedded etcd's peer address (without --etcd)")
	fs.StringVar(&c.EtcdCA, "etcd-ca", c.EtcdCA, "PEM file of the CA that signed etcd's certificates (TLS to etcd)")
	fs.StringVar(&c.EtcdCert, "etcd-cert", c.EtcdCert, "PEM file of this node's client certificate for etcd")
	fs.StringVar(&c.EtcdKey, "etcd-key", c.EtcdKey, "PEM file of this node's client key for etcd")
	fs.StringVar(&c.APITokenFile, "api-token-file", c.APITokenFile, "file holding the token every /api/ call must bear (Authorization: Bearer; empty: none)")
	fs.StringVar(&c.APITLSCert, "api-tls-cert", c.APITLSCert, "PEM certificate to serve the API over HTTPS (with --api-tls-key)")
	fs.StringVar(&c.APITLSKey, "api-tls-key", c.APITLSKey, "PEM key of --api-tls-cert")
	fs.StringVar(&c.APITLSCA, "api-tls-ca", c.APITLSCA, "PEM CA whose signed client certificate every API connection must present (mutual TLS)")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "the node's lease TTL: a node silent this long loses its changefeeds to others")
	fs.DurationVar(&c.BalanceInterval, "balance-interval", c.BalanceInterval, "how often the coordinator may move one changefeed only to even the load")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", c.DrainTimeout, "bound on SIGTERM's hand-off of the node's changefeeds")
	fs.Var((*goruntime.ByteSize)(&c.StoreCacheSize), "store-cache-size", "a `size` (128MiB; B, KiB, MiB, GiB, TiB, at least 1MiB): the block cache that the event stores of all the node's changefeeds share; "+
		"each store's memtables reserve their size in it, so that the stores hold about this much, not a cache per changefeed")
	fs.Var((*goruntime.ByteSize)(&c.StoreMemTableSize), "store-memtable-size", "a `size` (1MiB to 4GiB): each changefeed's event store's memtable; up to about three are in memory at once "+
		"while a changefeed is behind (a changefeed that keeps up keeps its newest rows beside them and writes few there)")
	fs.Var((*goruntime.ByteSize)(&c.SinkQueueSize), "sink-queue-size", "a `size` (16MiB to 1TiB): each changefeed's serve --sink-queue-size, the rows its sink holds in memory, "+
		"queued and not yet committed, in bytes (their values plus about 100 bytes a row); its source's stream waits beyond it")
	c.Settings.BindFlags(fs, "the node")
	fs.StringVar(&c.PprofAddr, "pprof-addr", c.PprofAddr, "loopback address serving /debug/pprof (empty: none)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json")
}

// Validate reports every bad field at once.
func (c Config) Validate() error {
	p := optcheck.New(ErrInvalidConfig)
	p.Require(c.DataDir != "", "--data-dir is required")
	p.Require(c.Cluster != "" && !strings.Contains(c.Cluster, "/"), "--cluster=%q: a name without /", c.Cluster)
	_, _, err := net.SplitHostPort(c.Addr)
	p.Require(err == nil, "--addr=%q: %v", c.Addr, err)
	if c.Etcd == "" {
		for _, a := range []struct{ flag, v string }{{"--etcd-client-addr", c.EtcdClientAddr}, {"--etcd-peer-addr", c.EtcdPeerAddr}} {
			_, _, err := net.SplitHostPort(a.v)
			p.Require(err == nil, "%s=%q: %v", a.flag, a.v, err)
		}
	}
	tls := 0
	for _, f := range []string{c.EtcdCA, c.EtcdCert, c.EtcdKey} {
		if f != "" {
			tls++
		}
	}
	p.Require(tls == 0 || tls == 3, "--etcd-ca, --etcd-cert and --etcd-key go together")
	p.Require((c.APITLSCert == "") == (c.APITLSKey == ""), "--api-tls-cert and --api-tls-key go together")
	p.Require(c.APITLSCA == "" || c.APITLSCert != "", "--api-tls-ca needs --api-tls-cert and --api-tls-key")
	p.Require(c.LeaseTTL >= 2*time.Second, "--lease-ttl=%v: at least 2s", c.LeaseTTL)
	p.Require(c.BalanceInterval > 0, "--balance-interval=%v: positive", c.BalanceInterval)
	p.Require(c.DrainTimeout > 0, "--drain-timeout=%v: positive", c.DrainTimeout)
	p.Require(c.LogFormat == "text" || c.LogFormat == "json", "--log-format=%q: text or json", c.LogFormat)
	p.Require(c.StoreCacheSize >= minStoreSize, "--store-cache-size=%d: at least 1MiB", c.StoreCacheSize)
	p.Require(c.StoreMemTableSize >= minStoreSize && c.StoreMemTableSize <= maxStoreMemTableSize, "--store-memtable-size=%d: 1MiB to 4GiB", c.StoreMemTableSize)
	p.Require(c.SinkQueueSize >= minSinkQueueSize && c.SinkQueueSize <= pgsink.MaxQueueBytes, "--sink-queue-size=%d: 16MiB to 1TiB", c.SinkQueueSize)
	c.Settings.Check(p)
	if c.PprofAddr != "" {
		host, _, err := net.SplitHostPort(c.PprofAddr)
		ip := net.ParseIP(host)
		p.Require(err == nil && (host == "localhost" || (ip != nil && ip.IsLoopback())), "--pprof-addr=%q: a loopback address", c.PprofAddr)
	}
	return p.Err()
}

// nodeID is the configured ID, or host name:API port.
func (c Config) nodeID() string {
	if c.NodeID != "" {
		return c.NodeID
	}
	host, _ := os.Hostname()
	_, port, _ := net.SplitHostPort(c.Addr)
	return fmt.Sprintf("%s-%s", host, port)
}
