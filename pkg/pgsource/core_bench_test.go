package pgsource

import (
	"strconv"
	"testing"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// BenchmarkStreamChange is the per-row hot path of the stream: an insert
// of a three-column row of a subscribed table, turned into a row of the
// transaction (its key and value encoded), the transaction's rows dropped
// every 1024 as a push would take them. rows/s is the unit that matters.
func BenchmarkStreamChange(b *testing.B) {
	rel := pgcodec.Relation{OID: 7, Schema: "public", Name: "t", Columns: []pgcodec.Column{
		{Name: "id", Type: "integer", Key: true}, {Name: "v", Type: "text"}, {Name: "n", Type: "bigint"}}}
	c := newCore(newStreamState(map[uint32]pgcodec.Relation{7: rel}), Position{}, 1<<30)
	c.rels[7] = &msgRelation{oid: 7, namespace: "public", name: "t", columns: []relColumn{{key: true, name: "id"}, {name: "v"}, {name: "n"}}}
	c.subs = map[uint32][]*sub{7: {{oid: 7}}}
	c.cur = &txn{ts: 100, pending: map[uint32][]common.Row{}}
	ids := make([][]byte, 1024)
	for i := range ids {
		ids[i] = []byte(strconv.Itoa(i))
	}
	v, n := []byte("a value of some thirty bytes..."), []byte("1234567890")
	tuple := make([]tupleCol, 3)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tuple[0], tuple[1], tuple[2] = tupleCol{kind: 't', data: ids[i%1024]}, tupleCol{kind: 't', data: v}, tupleCol{kind: 't', data: n}
		if err := c.change(7, pgcodec.Insert, nil, 0, tuple); err != nil {
			b.Fatal(err)
		}
		if i%1024 == 1023 {
			c.cur.pending[7] = c.cur.pending[7][:0]
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}
