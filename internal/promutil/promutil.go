package promutil

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterAll registers cs on reg. On any failure it unregisters those it
// registered and returns every error joined.
func RegisterAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	var errs []error
	var done []prometheus.Collector
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, c)
	}
	if len(errs) > 0 {
		UnregisterAll(reg, done...)
	}
	return errors.Join(errs...)
}

// UnregisterAll unregisters cs from reg (nil: nothing).
func UnregisterAll(reg prometheus.Registerer, cs ...prometheus.Collector) {
	if reg == nil {
		return
	}
	for _, c := range cs {
		reg.Unregister(c)
	}
}

// Sum gathers g and returns the sum of the counter and gauge values of
// every series named name, and how many series there were (0: none, the
// sum then 0).
func Sum(g prometheus.Gatherer, name string) (sum float64, series int, err error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			series++
		}
	}
	return sum, series, nil
}
