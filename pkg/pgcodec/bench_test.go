package pgcodec

import (
	"strconv"
	"testing"
)

// BenchmarkDecodeValue decodes a row value of a ten-column table as a sink
// does (DecodeValueNames with the table's names): no name is allocated,
// only the columns' slice.
func BenchmarkDecodeValue(b *testing.B) {
	names := make([]string, 10)
	cols := make([]Datum, 10)
	for i := range cols {
		names[i] = "column_" + strconv.Itoa(i)
		cols[i] = Datum{Name: names[i], Kind: Text, Text: []byte("a value of some thirty-two bytes")}
	}
	cols[3].Kind, cols[3].Text = Null, nil
	v := AppendValue(nil, RowChange{Change: Update, Columns: cols})
	b.ReportAllocs()
	b.SetBytes(int64(len(v)))
	for b.Loop() {
		if _, err := DecodeValueNames(v, names); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}
