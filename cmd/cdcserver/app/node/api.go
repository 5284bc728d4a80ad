package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/replicate"
	"github.com/cdcflow/eventservice/pkg/cluster"
)

// The HTTP API, version 1 (docs/reference/api.md). Every node serves it;
// each call reads and writes etcd, so any node answers for the cluster.
// Bodies are JSON; an error is {"error": "..."} with a status: 400 a bad
// request, 404 no such changefeed or node, 409 a name taken or a change
// the changefeed's state does not allow, 503 etcd unreachable.

// maxBody bounds a request's body.
const maxBody = 1 << 20

// createRequest is POST /api/v1/changefeeds's body.
type createRequest struct {
	Name   string           `json:"name"`
	Config ChangefeedConfig `json:"config"`
	// Paused creates it paused (default: running).
	Paused bool `json:"paused,omitempty"`
}

// queryResponse is GET /api/v1/changefeeds/{name}'s body.
type queryResponse struct {
	cluster.ChangefeedView
	// Status is what `cdcserver status` shows (absent with ?status=false,
	// or when it could not be read: StatusError says why).
	Status      *replicate.Status `json:"status,omitempty"`
	StatusError string            `json:"status_error,omitempty"`
}

// api is the node's HTTP handler.
func (n *node) api() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/changefeeds", n.list)
	mux.HandleFunc("POST /api/v1/changefeeds", n.create)
	mux.HandleFunc("GET /api/v1/changefeeds/{name}", n.query)
	mux.HandleFunc("PUT /api/v1/changefeeds/{name}", n.update)
	mux.HandleFunc("POST /api/v1/changefeeds/{name}/pause", n.setState(cluster.StatePaused))
	mux.HandleFunc("POST /api/v1/changefeeds/{name}/resume", n.setState(cluster.StateRunning))
	mux.HandleFunc("DELETE /api/v1/changefeeds/{name}", n.remove)
	mux.HandleFunc("GET /api/v1/nodes", n.nodes)
	mux.HandleFunc("POST /api/v1/nodes/{id}/drain", n.drainNode)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-n.ready:
			if n.member.Valid() {
				fmt.Fprintln(w, "ready")
				return
			}
		default:
		}
		http.Error(w, "not ready", http.StatusServiceUnavailable)
	})
	mux.Handle("GET /metrics", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g := append(prometheus.Gatherers{n.reg}, n.runs.gatherers()...)
		promhttp.HandlerFor(g, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	}))
	return mux
}

func (n *node) list(w http.ResponseWriter, r *http.Request) {
	list, err := n.store.List(r.Context())
	if err != nil {
		n.fail(w, err)
		return
	}
	reply(w, http.StatusOK, list)
}

func (n *node) create(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if !decode(w, r, &req) {
		return
	}
	if err := req.Config.Check(); err != nil {
		n.fail(w, err)
		return
	}
	raw, _ := json.Marshal(req.Config) // plain types
	state := cluster.StateRunning
	if req.Paused {
		state = cluster.StatePaused
	}
	if err := n.store.Create(r.Context(), req.Name, cluster.Spec{State: state, Config: raw}); err != nil {
		n.fail(w, err)
		return
	}
	v, err := n.store.Get(r.Context(), req.Name)
	if err != nil {
		n.fail(w, err)
		return
	}
	reply(w, http.StatusCreated, v)
}

func (n *node) query(w http.ResponseWriter, r *http.Request) {
	v, err := n.store.Get(r.Context(), r.PathValue("name"))
	if err != nil {
		n.fail(w, err)
		return
	}
	out := queryResponse{ChangefeedView: v}
	if r.URL.Query().Get("status") != "false" {
		ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
		defer cancel()
		if st, err := n.readStatus(ctx, v); err != nil {
			out.StatusError = err.Error()
		} else {
			out.Status = st
		}
	}
	reply(w, http.StatusOK, out)
}

// readStatus reads changefeed v's status from its two databases.
func (n *node) readStatus(ctx context.Context, v cluster.ChangefeedView) (*replicate.Status, error) {
	cfg, err := n.configOf(v)
	if err != nil {
		return nil, err
	}
	return replicate.ReadStatus(ctx, cfg.Source, cfg.Sink, cfg.Slot, cfg.Publication)
}

// configOf is the serve configuration v runs with on this node.
func (n *node) configOf(v cluster.ChangefeedView) (replicate.Config, error) {
	var c ChangefeedConfig
	if err := json.Unmarshal(v.Spec.Config, &c); err != nil {
		return replicate.Config{}, fmt.Errorf("%w: %w", ErrBadSpec, err)
	}
	return serveConfig(v.Name, c, n.cfg.DataDir, n.cfg.LogLevel)
}

func (n *node) update(w http.ResponseWriter, r *http.Request) {
	var c ChangefeedConfig
	if !decode(w, r, &c) {
		return
	}
	if err := c.Check(); err != nil {
		n.fail(w, err)
		return
	}
	raw, _ := json.Marshal(c) // plain types
	err := n.store.Update(r.Context(), r.PathValue("name"), func(s *cluster.Spec) error {
		if s.State != cluster.StatePaused {
			return fmt.Errorf("%w: pause it first (it is %s)", errNotPaused, s.State)
		}
		s.Config = raw
		return nil
	})
	n.replyView(w, r, err)
}

// errNotPaused is an update of a changefeed that is not paused.
var errNotPaused = errors.New("node: only a paused changefeed is updated")

// errRemoving is a change of a changefeed being removed.
var errRemoving = errors.New("node: the changefeed is being removed")

// stateRemoving is a changefeed remove has begun on: on no node, never
// resumed.
const stateRemoving = "removing"

func (n *node) setState(state string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		err := n.store.Update(r.Context(), r.PathValue("name"), func(s *cluster.Spec) error {
			if s.State == stateRemoving {
				return errRemoving
			}
			s.State = state
			return nil
		})
		n.replyView(w, r, err)
	}
}

// remove takes the changefeed off every node, waits until no node runs
// it, removes it as `cdcserver remove` does (its slot, its publication if
// it made it, the target's cdcflow state; the target's tables stay), and
// deletes its keys. A remove that fails leaves it "removing": DELETE
// again.
func (n *node) remove(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := n.store.Update(r.Context(), name, func(s *cluster.Spec) error { s.State = stateRemoving; return nil }); err != nil {
		n.fail(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Minute)
	defer cancel()
	var v cluster.ChangefeedView
	for {
		var err error
		if v, err = n.store.Get(ctx, name); err != nil {
			n.fail(w, err)
			return
		}
		if v.Assignment == nil || v.Assignment.Node == "" {
			break
		}
		select {
		case <-ctx.Done():
			n.fail(w, fmt.Errorf("the changefeed still runs on node %s: %w", v.Assignment.Node, ctx.Err()))
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	cfg, err := n.configOf(v)
	if err != nil {
		n.fail(w, err)
		return
	}
	var out bytes.Buffer
	// Forced: a node that ran it may still hold its slot's walsender
	// until its clean stop ends; remove fences it out of the target first.
	if err := replicate.Remove(ctx, replicate.RemoveOptions{Source: cfg.Source, Sink: cfg.Sink, Slot: cfg.Slot, Publication: cfg.Publication,
		Force: true}, &out); err != nil {
		n.fail(w, fmt.Errorf("%w (%s)", err, out.String()))
		return
	}
	if err := n.store.Delete(ctx, name); err != nil {
		n.fail(w, err)
		return
	}
	reply(w, http.StatusOK, map[string]string{"removed": name, "report": out.String()})
}

func (n *node) nodes(w http.ResponseWriter, r *http.Request) {
	nodes, err := n.store.Nodes(r.Context())
	if err != nil {
		n.fail(w, err)
		return
	}
	reply(w, http.StatusOK, nodes)
}

func (n *node) drainNode(w http.ResponseWriter, r *http.Request) {
	if err := n.store.Drain(r.Context(), r.PathValue("id")); err != nil {
		n.fail(w, err)
		return
	}
	reply(w, http.StatusOK, map[string]string{"draining": r.PathValue("id")})
}

// replyView answers a change with the changefeed as it is now.
func (n *node) replyView(w http.ResponseWriter, r *http.Request, err error) {
	if err != nil {
		n.fail(w, err)
		return
	}
	v, err := n.store.Get(r.Context(), r.PathValue("name"))
	if err != nil {
		n.fail(w, err)
		return
	}
	reply(w, http.StatusOK, v)
}

// fail answers err with its status.
func (n *node) fail(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, cluster.ErrBadName), errors.Is(err, ErrBadSpec), errors.Is(err, ErrClearPassword):
		code = http.StatusBadRequest
	case errors.Is(err, cluster.ErrNoChangefeed), errors.Is(err, cluster.ErrNoNode):
		code = http.StatusNotFound
	case errors.Is(err, cluster.ErrChangefeedExists), errors.Is(err, errNotPaused), errors.Is(err, errRemoving):
		code = http.StatusConflict
	case errors.Is(err, context.DeadlineExceeded):
		code = http.StatusServiceUnavailable
	}
	if code == http.StatusInternalServerError {
		n.log.Warn("an API call failed", zap.Error(err))
	}
	reply(w, code, map[string]string{"error": err.Error()})
}

// decode reads r's JSON body into v, answering 400 if it does not read.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		reply(w, http.StatusBadRequest, map[string]string{"error": "the body does not read: " + err.Error()})
		return false
	}
	return true
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
