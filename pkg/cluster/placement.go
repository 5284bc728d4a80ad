package cluster

import (
	"cmp"
	"slices"
)

// Placement is the coordinator's decision, as a pure function: which live
// node runs each changefeed. The shell (the coordinator's loop) reads the
// nodes and changefeeds from etcd, calls Place, and writes each decision
// as an assignment guarded by its leadership (a deposed coordinator's
// write fails); nodes act on assignments, never on decisions.

// PlaceNode is a live node: its membership key exists under its lease.
type PlaceNode struct {
	ID string
	// Draining: it hands its changefeeds off and is given none.
	Draining bool
}

// PlaceChangefeed is a changefeed as the coordinator sees it.
type PlaceChangefeed struct {
	Name string
	// Running is the desired state: false for a paused changefeed.
	Running bool
	// Node is the node its assignment names ("" for none).
	Node string
}

// PlaceInput is what one placement round decides from.
type PlaceInput struct {
	Nodes       []PlaceNode
	Changefeeds []PlaceChangefeed
	// MaxBalanceMoves bounds the moves made only to even the load in one
	// round (a node that joins takes changefeeds a few at a time: each
	// move stops a changefeed for a hand-off). Moves off a node that is
	// gone or draining, and placements, are never held back.
	MaxBalanceMoves int
}

// Decision changes one changefeed's assignment from From to To ("" for
// none: paused, or no node to run it).
type Decision struct {
	Changefeed string
	From, To   string
	Why        Reason
}

// Reason says why a decision was made.
type Reason string

// The reasons of decisions.
const (
	ReasonPaused  Reason = "paused"        // desired paused: taken off its node
	ReasonNewNode Reason = "placed"        // running and on no node
	ReasonGone    Reason = "node gone"     // its node's lease expired
	ReasonDrain   Reason = "node draining" // its node hands off
	ReasonBalance Reason = "balance"       // evens the load
	ReasonNoNode  Reason = "no live node"  // running, but no node may take it
)

// Place decides a round: each decision once, in changefeed name order
// within each kind (paused, moved off gone or draining nodes, placed,
// balanced). The load of a node is the changefeeds it runs after the
// decisions before; a changefeed goes to the least loaded node that may
// take it (ties by ID), so that the result does not depend on the order of
// the input.
func Place(in PlaceInput) []Decision {
	live := map[string]PlaceNode{}
	load := map[string]int{}
	for _, n := range in.Nodes {
		live[n.ID] = n
		load[n.ID] = 0
	}
	cfs := slices.Clone(in.Changefeeds)
	slices.SortFunc(cfs, func(a, b PlaceChangefeed) int { return cmp.Compare(a.Name, b.Name) })
	at := map[string]string{} // changefeed -> node, as decided so far
	for _, cf := range cfs {
		if _, ok := live[cf.Node]; ok && cf.Running {
			at[cf.Name] = cf.Node
			load[cf.Node]++
		}
	}
	var out []Decision
	decided := map[string]bool{} // one decision per changefeed a round
	least := func(except string) string {
		best := ""
		for id, n := range live {
			if n.Draining || id == except {
				continue
			}
			if best == "" || load[id] < load[best] || load[id] == load[best] && id < best {
				best = id
			}
		}
		return best
	}
	move := func(cf PlaceChangefeed, why Reason) {
		to := least("")
		if to == "" {
			why = ReasonNoNode
		}
		if to == cf.Node && why == ReasonNoNode {
			return
		}
		if cur, ok := at[cf.Name]; ok {
			load[cur]--
		}
		if to != "" {
			load[to]++
			at[cf.Name] = to
		} else {
			delete(at, cf.Name)
		}
		out = append(out, Decision{Changefeed: cf.Name, From: cf.Node, To: to, Why: why})
		decided[cf.Name] = true
	}
	for _, cf := range cfs {
		if !cf.Running && cf.Node != "" {
			out = append(out, Decision{Changefeed: cf.Name, From: cf.Node, Why: ReasonPaused})
		}
	}
	for _, cf := range cfs {
		if !cf.Running || cf.Node == "" {
			continue
		}
		switch n, ok := live[cf.Node]; {
		case !ok:
			move(cf, ReasonGone)
		case n.Draining:
			move(cf, ReasonDrain)
		}
	}
	for _, cf := range cfs {
		if cf.Running && cf.Node == "" {
			move(cf, ReasonNewNode)
		}
	}
	for moves := 0; moves < in.MaxBalanceMoves; moves++ {
		// The most loaded node that may keep its changefeeds (ties by
		// ID), and its first changefeed by name.
		most := ""
		for id, n := range live {
			if n.Draining {
				continue
			}
			if most == "" || load[id] > load[most] || load[id] == load[most] && id < most {
				most = id
			}
		}
		to := least(most)
		if most == "" || to == "" || load[most]-load[to] <= 1 {
			break
		}
		moved := false
		for _, cf := range cfs {
			if at[cf.Name] == most && !decided[cf.Name] {
				load[most]--
				load[to]++
				at[cf.Name] = to
				out = append(out, Decision{Changefeed: cf.Name, From: most, To: to, Why: ReasonBalance})
				decided[cf.Name], moved = true, true
				break
			}
		}
		if !moved {
			break // what it runs was all placed this round
		}
	}
	return out
}
