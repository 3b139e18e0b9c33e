// Package gatemetrics holds what every gate's Prometheus metrics share: the
// registration that lets two gates on one registry share their collectors.
package gatemetrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c with reg and returns it, or returns the collector of
// the same kind already registered there under its name, so a second gate
// on one registry counts into the first one's metrics. Any other
// registration error is returned.
func Register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var already prometheus.AlreadyRegisteredError
	if !errors.As(err, &already) {
		return c, err
	}
	existing, ok := already.ExistingCollector.(T)
	if !ok {
		return c, err
	}
	return existing, nil
}
