package memory

import "time"

// The defaults of the options below; they match those of the PostgreSQL
// store.
const (
	defaultLockTimeout = 2 * time.Second
	defaultTTL         = 24 * time.Hour
	// defaultAuditRetention is how long an audit entry is kept.
	defaultAuditRetention = 90 * 24 * time.Hour
)

type options struct {
	lockTimeout time.Duration
	ttl         time.Duration
	now         func() time.Time
	audit       time.Duration
}

var defaultOptions = options{
	lockTimeout: defaultLockTimeout,
	ttl:         defaultTTL,
	now:         time.Now,
	audit:       defaultAuditRetention,
}

// Option configures a [Store].
type Option func(*options)

// WithLockTimeout bounds how long a claim waits for a concurrent request
// that holds the same key in atomic mode and has not finished yet. When the
// owner records its outcome within the bound, the claim returns its entry;
// when the owner releases the key, the claim takes it; when the bound runs
// out, the claim fails with store.ErrInUse. The bound covers the whole wait
// of one call and is measured in real time, whatever [WithClock] says.
// Default: 2 seconds. Zero or a negative value: a claim of a held key does
// not wait and fails with store.ErrInUse at once.
func WithLockTimeout(d time.Duration) Option {
	return func(o *options) { o.lockTimeout = max(d, 0) }
}

// WithTTL sets how long a key is kept (it expires at claim time + ttl). Past
// it the key counts as absent, so a request with that key runs again.
// Default: 24 hours. Non-positive values select the default.
func WithTTL(ttl time.Duration) Option {
	return func(o *options) {
		if ttl <= 0 {
			ttl = defaultTTL
		}
		o.ttl = ttl
	}
}

// WithClock sets the clock by which keys expire and leases run out, so that
// a test can move time forward instead of sleeping. It must be safe for
// concurrent use. The lock timeout is not affected. Default: time.Now. A nil
// clock selects the default.
func WithClock(now func() time.Time) Option {
	return func(o *options) {
		if now == nil {
			now = time.Now
		}
		o.now = now
	}
}

// WithAuditRetention sets how long an entry of the audit trail (see
// store.Admin) is kept: past it, the entry is swept, as expired keys are.
// Default: 90 days. Non-positive values select the default.
func WithAuditRetention(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			d = defaultAuditRetention
		}
		o.audit = d
	}
}
