package postgres

import "time"

// WithListenCheck sets how long Listen's connection may carry no notice
// before it is pinged, and how long the ping may take.
func WithListenCheck(check, ping time.Duration) Option {
	return func(o *options) { o.listen = listenTiming{check: check, ping: ping} }
}
