package upstream_test

import (
	"context"
	"fmt"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/upstream"
)

type printSink struct{}

func (printSink) Push(_ context.Context, b eventstore.Batch) error {
	fmt.Printf("pushed %d rows, resolved-ts %d\n", len(b.Rows), b.ResolvedTs)
	return nil
}

func ExampleManual() {
	m := upstream.NewManual()
	span := common.TableSpan(1)
	sub, _ := m.Subscribe(span, 100, printSink{})
	_ = m.Push(context.Background(), span, eventstore.Batch{
		Rows:       []common.Row{{Op: common.OpPut, Key: []byte("k"), Value: []byte("v"), StartTs: 101, CommitTs: 102}},
		ResolvedTs: 105,
	})
	sub.Close()
	err := m.Push(context.Background(), span, eventstore.Batch{ResolvedTs: 110})
	fmt.Println(err != nil, m.SubscribeCount(span))
	// Output:
	// pushed 1 rows, resolved-ts 105
	// true 1
}

func ExampleGenerator_Rows() {
	start := common.TsFromTime(time.UnixMilli(1_700_000_000_000))
	g, err := upstream.NewGenerator(upstream.GeneratorOptions{
		Tables: 10, RowsPerSec: 3000, Seed: 1, StartTs: start,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer g.Close()
	// One second of table 3: about 3000/10 rows, always the same ones.
	end := start + common.ComposeTs(1000, 0)
	rows := g.Rows(3, start, end)
	fmt.Println(len(rows), g.RowCount(3, start, end), rows[0].CommitTs > start)
	// Output: 312 312 true
}
