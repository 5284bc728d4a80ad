package cluster

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/stretchr/testify/require"
)

// TestPlacement plays the scripts of testdata/placement: each "place"
// describes the nodes and changefeeds of a round, one per line, and prints
// its decisions; "apply" (a flag of place) makes them the next round's
// state, so a script follows a cluster through joins, deaths and drains.
//
//	place [max-moves=N] [apply]
//	node ID [draining]
//	cf NAME running|paused [on=NODE]
func TestPlacement(t *testing.T) {
	datadriven.Walk(t, "testdata/placement", func(t *testing.T, path string) {
		var applied map[string]string // changefeed -> node after the last applied round
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "place" {
				t.Fatalf("%s: unknown command %q", filepath.Base(path), d.Cmd)
			}
			in := PlaceInput{}
			apply := d.HasArg("apply")
			if d.HasArg("max-moves") {
				d.ScanArgs(t, "max-moves", &in.MaxBalanceMoves)
			}
			for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
				f := strings.Fields(line)
				switch {
				case len(f) >= 2 && f[0] == "node":
					in.Nodes = append(in.Nodes, PlaceNode{ID: f[1], Draining: len(f) > 2 && f[2] == "draining"})
				case len(f) >= 3 && f[0] == "cf":
					cf := PlaceChangefeed{Name: f[1], Running: f[2] == "running"}
					if node, ok := applied[cf.Name]; ok {
						cf.Node = node
					}
					for _, kv := range f[3:] {
						if v, ok := strings.CutPrefix(kv, "on="); ok {
							cf.Node = v
						}
					}
					in.Changefeeds = append(in.Changefeeds, cf)
				default:
					t.Fatalf("bad line %q", line)
				}
			}
			out := Place(in)
			var b strings.Builder
			for _, dec := range out {
				fmt.Fprintf(&b, "%s: %s -> %s (%s)\n", dec.Changefeed, orNone(dec.From), orNone(dec.To), dec.Why)
			}
			if apply {
				next := map[string]string{}
				for _, cf := range in.Changefeeds {
					next[cf.Name] = cf.Node
				}
				for _, dec := range out {
					next[dec.Changefeed] = dec.To
				}
				applied = next
				fmt.Fprintf(&b, "load: %s\n", loads(in.Nodes, next))
			}
			if b.Len() == 0 {
				return "no decisions\n"
			}
			return b.String()
		})
	})
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// loads prints each node's changefeeds after a round.
func loads(nodes []PlaceNode, at map[string]string) string {
	var parts []string
	for _, n := range nodes {
		k := 0
		for _, node := range at {
			if node == n.ID {
				k++
			}
		}
		parts = append(parts, fmt.Sprintf("%s=%d", n.ID, k))
	}
	return strings.Join(parts, " ")
}

// Whatever the cluster, a round with room for every balance move leaves
// each running changefeed on exactly one live node that is not draining
// (when there is one), paused ones on none, the loads within one of each
// other, and decides each changefeed at most once.
func TestPlaceProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(59, 1))
	for round := range 2000 {
		var in PlaceInput
		ids := []string{"a", "b", "c", "d", "e"}[:r.IntN(5)]
		for _, id := range ids {
			in.Nodes = append(in.Nodes, PlaceNode{ID: id, Draining: r.IntN(4) == 0})
		}
		for k := range r.IntN(12) {
			cf := PlaceChangefeed{Name: fmt.Sprintf("cf%02d", k), Running: r.IntN(5) > 0}
			if r.IntN(3) > 0 {
				cf.Node = []string{"a", "b", "c", "d", "e", "gone"}[r.IntN(6)]
			}
			in.Changefeeds = append(in.Changefeeds, cf)
		}
		in.MaxBalanceMoves = 100
		out := Place(in)
		at := map[string]string{}
		for _, cf := range in.Changefeeds {
			at[cf.Name] = cf.Node
		}
		seen := map[string]bool{}
		for _, d := range out {
			require.False(t, seen[d.Changefeed], "round %d: %s decided twice: %v", round, d.Changefeed, out)
			seen[d.Changefeed] = true
			require.Equal(t, at[d.Changefeed], d.From, "round %d", round)
			at[d.Changefeed] = d.To
		}
		takers := map[string]int{}
		for _, n := range in.Nodes {
			if !n.Draining {
				takers[n.ID] = 0
			}
		}
		for _, cf := range in.Changefeeds {
			node := at[cf.Name]
			switch {
			case !cf.Running:
				require.Empty(t, node, "round %d: paused %s", round, cf.Name)
			case len(takers) == 0:
				require.Empty(t, node, "round %d: %s with no node to take it", round, cf.Name)
			default:
				_, ok := takers[node]
				require.True(t, ok, "round %d: %s on %q", round, cf.Name, node)
				takers[node]++
			}
		}
		lo, hi := -1, -1
		for _, k := range takers {
			if lo < 0 || k < lo {
				lo = k
			}
			hi = max(hi, k)
		}
		require.LessOrEqual(t, hi-lo, 1, "round %d: loads %v", round, takers)
	}
}
