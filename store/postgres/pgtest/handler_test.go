package pgtest_test

import "testing"

// TestHandlerExample runs the test that Example_handlerTest shows.
func TestHandlerExample(t *testing.T) { testCreatePayment(t) }
