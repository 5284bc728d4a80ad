package cluster

import "strings"

// Keys lays out a cluster's keys under one root ("/cdcflow/<cluster>/"):
//
//	nodes/<id>                   a live node (under its lease): its info
//	coordinator/<lease>          the coordinator election's candidates
//	changefeeds/<name>/spec      a changefeed's specification and desired state
//	changefeeds/<name>/assign    the node it is assigned to, by the coordinator
type Keys struct{ root string }

// NewKeys returns the keys of cluster name.
func NewKeys(name string) Keys { return Keys{root: "/cdcflow/" + name + "/"} }

// Nodes is the prefix of the nodes' keys.
func (k Keys) Nodes() string { return k.root + "nodes/" }

// Node is node id's key.
func (k Keys) Node(id string) string { return k.Nodes() + id }

// NodeID is the node ID of a key under Nodes ("" for another key).
func (k Keys) NodeID(key string) string {
	id, _ := strings.CutPrefix(key, k.Nodes())
	if id == key {
		return ""
	}
	return id
}

// Election is the coordinator election's prefix.
func (k Keys) Election() string { return k.root + "coordinator/" }

// Changefeeds is the prefix of the changefeeds' keys.
func (k Keys) Changefeeds() string { return k.root + "changefeeds/" }

// Spec is changefeed name's specification key.
func (k Keys) Spec(name string) string { return k.Changefeeds() + name + "/spec" }

// Assignment is changefeed name's assignment key.
func (k Keys) Assignment(name string) string { return k.Changefeeds() + name + "/assign" }

// changefeedKey splits a key under Changefeeds into the changefeed's name
// and what the key holds ("spec", "assign"; "" for another key).
func (k Keys) changefeedKey(key string) (name, what string) {
	rest, ok := strings.CutPrefix(key, k.Changefeeds())
	if !ok {
		return "", ""
	}
	i := strings.LastIndexByte(rest, '/')
	if i <= 0 {
		return "", ""
	}
	return rest[:i], rest[i+1:]
}
