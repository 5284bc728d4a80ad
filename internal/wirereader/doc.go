// Package wirereader is the module's one reader of bytes that crossed a
// trust boundary: pgoutput's messages (pkg/pgsource), the row values a
// source wrote and a sink reads (pkg/pgcodec) and the remote transport's
// frames (pkg/remote). Each decoder reads its format through a Reader and
// checks the error once, at the end.
//
// Invariants:
//   - Nothing panics and nothing is allocated for a length or a count the
//     bytes do not back: Bytes, String and CString take only bytes that
//     are present, and Count refuses a count larger than the bytes left
//     could hold at the fewest bytes an element takes.
//   - The first error sticks: Err returns it for ever after, it wraps the
//     sentinel the Reader was made with (or is the error given to
//     FailWith), and once it is set no byte is left, so every later read
//     returns a zero value and fails no further.
//   - Bytes returns a sub-slice of the input, capped at its length, so an
//     append to it cannot write into the bytes that follow; String and
//     CString copy.
//   - A read that succeeds allocates nothing but the strings it returns;
//     only a failure formats its message.
//
// Integers are big-endian (U16, U32, U64) or varints (Uvarint, Varint, as
// encoding/binary writes them). FuzzReader checks every invariant above
// against a naive model of the same reads.
package wirereader
