package eventcollector_test

import (
	"context"
	"fmt"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/eventservice"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
	"github.com/cdcflow/eventservice/pkg/upstream"
)

// A changefeed's receiving end on the whole stack: one dispatcher of table
// 1 receives its rows, in order, and its checkpoint reaches the resolved-ts.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	must := func(err error) {
		if err != nil {
			fmt.Println("error:", err)
		}
	}

	up := upstream.NewManual()
	store, err := eventstore.Open(eventstore.Options{Upstream: up}) // in-memory pebble
	must(err)
	must(store.Start())
	schema, err := schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1})
	must(err)
	transport, err := messaging.NewInProcess(messaging.InProcessOptions{})
	must(err)
	inbox, err := transport.Register("changefeed-1")
	must(err)
	svc, err := eventservice.New(eventservice.Options{Store: store, Schema: schema, Transport: transport})
	must(err)
	must(svc.Start())

	sink := eventcollector.NewMemorySink()
	coll, err := eventcollector.New(eventcollector.Options{Service: svc, Inbox: inbox, Sink: sink})
	must(err)
	must(coll.Start())

	id := common.DispatcherIDFromUint64(1)
	must(coll.AddDispatcher(context.Background(), id, common.TableSpan(1), 10))
	must(schema.AdvanceResolvedTs(1000)) // the service never reads beyond it
	must(up.Push(ctx, common.TableSpan(1), eventstore.Batch{ResolvedTs: 50, Rows: []common.Row{
		{Op: common.OpPut, Key: []byte("a"), Value: []byte("1"), StartTs: 15, CommitTs: 20},
		{Op: common.OpPut, Key: []byte("b"), Value: []byte("2"), StartTs: 25, CommitTs: 30},
	}}))
	must(sink.WaitCheckpoint(ctx, id, 50))
	for _, r := range sink.Applied(id) {
		fmt.Printf("%s=%s at %d\n", r.Key, r.Value, uint64(r.CommitTs))
	}
	fmt.Println("checkpoint", uint64(sink.CheckpointOf(id)), "resets", coll.Stats().TotalResets())

	// Shut down downstream first: collector, service, store, transport.
	must(coll.Close())
	must(svc.Close())
	must(store.Close())
	transport.Close()
	// Output:
	// a=1 at 20
	// b=2 at 30
	// checkpoint 50 resets 0
}
