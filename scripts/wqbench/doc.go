// Package wqbench compares pkg/pendingset's Add with client-go's workqueue
// Add on the same key streams. It is its own module so that the main module
// does not depend on client-go; run it with
//
//	cd scripts/wqbench && go test -run '^$' -bench . -count 5
//
// Both queues get 100k keys, all added once (warm), then visited in one
// fixed random order, with the consumer stalled (every Add finds its key
// pending: a dedupe) or live (a goroutine drains and completes as fast as
// it can). The stream is the same for both, so the ratio of their ns/op is
// the comparison issue 12 asks for.
package wqbench
