package eventservice_test

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

// Example embeds the store, the service and a collector: the README's
// embedding example, compiled and run as a test.
func Example() {
	up := upstream.NewManual()                                    // your eventstore.Upstream in production
	store, _ := eventstore.Open(eventstore.Options{Upstream: up}) // Dir "": in-memory pebble
	_ = store.Start()
	defer store.Close()
	schema, _ := schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1})
	tr, _ := messaging.NewInProcess(messaging.InProcessOptions{})
	defer tr.Close()
	svc, _ := eventservice.New(eventservice.Options{Store: store, Schema: schema, Transport: tr})
	_ = svc.Start()
	defer svc.Close() // before store.Close (defers run last-in first-out)

	inbox, _ := tr.Register("changefeed-1")
	sink := eventcollector.NewMemorySink()
	coll, _ := eventcollector.New(eventcollector.Options{Service: svc, Inbox: inbox, Sink: sink})
	_ = coll.Start()
	defer coll.Close()

	id := common.DispatcherIDFromUint64(1)
	_ = coll.AddDispatcher(context.Background(), id, common.TableSpan(42), 100)

	// The upstream commits two transactions sharing commit-ts 110, then a
	// DDL at 120 and a row after it; the schema store knows up to 200.
	_ = schema.AddDDL(schemastore.DDL{TableID: 42, CommitTs: 120, Query: "ALTER TABLE t42 ADD COLUMN c INT"})
	_ = schema.AdvanceResolvedTs(200)
	put := func(key string, start, commit common.Ts) common.Row {
		return common.Row{Op: common.OpPut, Key: []byte(key), Value: []byte("v"), StartTs: start, CommitTs: commit}
	}
	_ = up.Push(context.Background(), common.TableSpan(42), eventstore.Batch{
		Rows:       []common.Row{put("a", 101, 110), put("b", 105, 110), put("c", 121, 130)},
		ResolvedTs: 150,
	})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = sink.WaitCheckpoint(ctx, id, 150)
	for _, r := range sink.Applied(id) {
		fmt.Printf("row %s at %d\n", r.Key, r.CommitTs)
	}
	for _, d := range sink.AppliedDDLs(id) {
		fmt.Printf("ddl at %d: %s\n", d.CommitTs, d.Query)
	}
	fmt.Println("checkpoint", uint64(sink.CheckpointOf(id)))
	// Output:
	// row a at 110
	// row b at 110
	// row c at 130
	// ddl at 120: ALTER TABLE t42 ADD COLUMN c INT
	// checkpoint 150
}
