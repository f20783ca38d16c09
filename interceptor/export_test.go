package interceptor

// CallKey exposes callKey, the key of a call that names no step, for the
// tests of package interceptor_test.
var CallKey = callKey
