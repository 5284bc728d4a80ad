package pendingset

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// The ready FIFO's ring against a slice model: pushes at both ends and
// pops, across growth and wrap-around.
func TestFIFOMatchesASliceModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	var f fifo
	var model []int32
	for step := range 20_000 {
		switch r := rng.IntN(10); {
		case r < 4:
			f.push(int32(step), false)
			model = append(model, int32(step))
		case r < 6:
			f.push(int32(step), true)
			model = append([]int32{int32(step)}, model...)
		default:
			if len(model) == 0 {
				continue
			}
			require.Equal(t, model[0], f.front())
			require.Equal(t, model[0], f.pop())
			model = model[1:]
		}
		require.Equal(t, len(model), f.len)
		if step%97 == 0 {
			for j := range model {
				require.Equal(t, model[j], f.at(j), "step %d, entry %d", step, j)
			}
		}
	}
}
