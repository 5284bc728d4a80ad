package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Store is the API's side of the keys: changefeeds' specifications and
// desired states, the nodes, read and written with revision checks so
// that two API calls racing each other never lose one's write.
type Store struct {
	client *clientv3.Client
	keys   Keys
}

// NewStore reads and writes cluster keys through client.
func NewStore(client *clientv3.Client, keys Keys) *Store { return &Store{client: client, keys: keys} }

// nameRE is a changefeed's name: a key segment, a slot name's alphabet.
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ValidName reports whether name may name a changefeed (ErrBadName).
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%w: %q: lower-case letters, digits, _ and -, at most 63, starting with a letter or digit", ErrBadName, name)
	}
	return nil
}

// ChangefeedView is a changefeed as the store holds it.
type ChangefeedView struct {
	Name       string      `json:"name"`
	Spec       Spec        `json:"spec"`
	Assignment *Assignment `json:"assignment,omitempty"`
}

// Create writes a new changefeed's specification (ErrChangefeedExists if
// the name is taken).
func (s *Store) Create(ctx context.Context, name string, spec Spec) error {
	if err := ValidName(name); err != nil {
		return err
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	key := s.keys.Spec(name)
	resp, err := s.client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).Then(clientv3.OpPut(key, string(b))).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %s", ErrChangefeedExists, name)
	}
	return nil
}

// Get reads changefeed name (ErrNoChangefeed if there is none).
func (s *Store) Get(ctx context.Context, name string) (ChangefeedView, error) {
	v := ChangefeedView{Name: name}
	if err := ValidName(name); err != nil {
		return v, err
	}
	resp, err := s.client.Txn(ctx).Then(clientv3.OpGet(s.keys.Spec(name)), clientv3.OpGet(s.keys.Assignment(name))).Commit()
	if err != nil {
		return v, err
	}
	specs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(specs) == 0 {
		return v, fmt.Errorf("%w: %s", ErrNoChangefeed, name)
	}
	if err := json.Unmarshal(specs[0].Value, &v.Spec); err != nil {
		return v, fmt.Errorf("cluster: changefeed %s's specification does not read: %w", name, err)
	}
	if as := resp.Responses[1].GetResponseRange().GetKvs(); len(as) > 0 {
		var a Assignment
		if json.Unmarshal(as[0].Value, &a) == nil {
			v.Assignment = &a
		}
	}
	return v, nil
}

// List reads every changefeed, by name.
func (s *Store) List(ctx context.Context) ([]ChangefeedView, error) {
	resp, err := s.client.Get(ctx, s.keys.Changefeeds(), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	byName := map[string]*ChangefeedView{}
	view := func(name string) *ChangefeedView {
		if v, ok := byName[name]; ok {
			return v
		}
		v := &ChangefeedView{Name: name}
		byName[name] = v
		return v
	}
	for _, kv := range resp.Kvs {
		name, what := s.keys.changefeedKey(string(kv.Key))
		switch what {
		case "spec":
			_ = json.Unmarshal(kv.Value, &view(name).Spec) // one that does not read lists with its name
		case "assign":
			var a Assignment
			if json.Unmarshal(kv.Value, &a) == nil {
				view(name).Assignment = &a
			}
		}
	}
	out := make([]ChangefeedView, 0, len(byName))
	for _, v := range byName {
		if v.Spec.State != "" {
			out = append(out, *v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Update changes changefeed name's specification with f, read and written
// at one revision (a write between them: read again and f again).
func (s *Store) Update(ctx context.Context, name string, f func(*Spec) error) error {
	if err := ValidName(name); err != nil {
		return err
	}
	key := s.keys.Spec(name)
	for {
		resp, err := s.client.Get(ctx, key)
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 {
			return fmt.Errorf("%w: %s", ErrNoChangefeed, name)
		}
		var spec Spec
		if err := json.Unmarshal(resp.Kvs[0].Value, &spec); err != nil {
			return fmt.Errorf("cluster: changefeed %s's specification does not read: %w", name, err)
		}
		if err := f(&spec); err != nil {
			return err
		}
		b, err := json.Marshal(spec)
		if err != nil {
			return err
		}
		put, err := s.client.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)).
			Then(clientv3.OpPut(key, string(b))).Commit()
		if err != nil {
			return err
		}
		if put.Succeeded {
			return nil
		}
	}
}

// Delete deletes changefeed name's keys: the caller has seen it on no
// node (a running one is taken off its node first: remove pauses it).
func (s *Store) Delete(ctx context.Context, name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	_, err := s.client.Txn(ctx).Then(clientv3.OpDelete(s.keys.Spec(name)), clientv3.OpDelete(s.keys.Assignment(name))).Commit()
	return err
}

// NodeView is a live node.
type NodeView struct {
	ID   string   `json:"id"`
	Info NodeInfo `json:"info"`
	// Changefeeds are those assigned to it.
	Changefeeds []string `json:"changefeeds"`
	// Coordinator: it is the coordinator.
	Coordinator bool `json:"coordinator"`
}

// Nodes reads the live nodes, by ID.
func (s *Store) Nodes(ctx context.Context) ([]NodeView, error) {
	resp, err := s.client.Txn(ctx).Then(clientv3.OpGet(s.keys.Nodes(), clientv3.WithPrefix()),
		clientv3.OpGet(s.keys.Election(), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1)),
		clientv3.OpGet(s.keys.Changefeeds(), clientv3.WithPrefix())).Commit()
	if err != nil {
		return nil, err
	}
	coordinator := ""
	if kvs := resp.Responses[1].GetResponseRange().GetKvs(); len(kvs) > 0 {
		coordinator = string(kvs[0].Value)
	}
	assigned := map[string][]string{}
	for _, kv := range resp.Responses[2].GetResponseRange().GetKvs() {
		if name, what := s.keys.changefeedKey(string(kv.Key)); what == "assign" {
			var a Assignment
			if json.Unmarshal(kv.Value, &a) == nil && a.Node != "" {
				assigned[a.Node] = append(assigned[a.Node], name)
			}
		}
	}
	var out []NodeView
	for _, kv := range resp.Responses[0].GetResponseRange().GetKvs() {
		v := NodeView{ID: s.keys.NodeID(string(kv.Key))}
		_ = json.Unmarshal(kv.Value, &v.Info) // one that does not read lists with its ID
		v.Changefeeds = assigned[v.ID]
		sort.Strings(v.Changefeeds)
		v.Coordinator = v.ID == coordinator
		out = append(out, v)
	}
	return out, nil
}

// Drain marks node id draining: the coordinator moves its changefeeds
// off and gives it none (ErrNoNode if it is not live). The key keeps the
// node's lease.
func (s *Store) Drain(ctx context.Context, id string) error {
	key := s.keys.Node(id)
	for {
		resp, err := s.client.Get(ctx, key)
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 {
			return fmt.Errorf("%w: %s", ErrNoNode, id)
		}
		kv := resp.Kvs[0]
		var info NodeInfo
		if err := json.Unmarshal(kv.Value, &info); err != nil {
			return fmt.Errorf("cluster: node %s's key does not read: %w", id, err)
		}
		if info.Draining {
			return nil
		}
		info.Draining = true
		b, _ := json.Marshal(info) // plain types
		put, err := s.client.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
			Then(clientv3.OpPut(key, string(b), clientv3.WithLease(clientv3.LeaseID(kv.Lease)))).Commit()
		if err != nil {
			return err
		}
		if put.Succeeded {
			return nil
		}
	}
}
