// Package oteltest holds the tests of idem's metrics and spans, read back
// with the OpenTelemetry SDK (a manual metric reader and an in-memory span
// recorder). They are a module of their own so that idem's go.mod depends
// on the OpenTelemetry API only, never on the SDK: a test file of idem's
// module would add the SDK to its requirements. The package has no code of
// its own and is not for import.
package oteltest
