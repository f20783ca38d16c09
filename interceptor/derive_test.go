package interceptor

import "testing"

func TestDeriveKey(t *testing.T) {
	a := DeriveKey("parent", "charge")
	if len(a) != 64 {
		t.Fatalf("len = %d, want 64", len(a))
	}
	if err := ValidateKey(a); err != nil {
		t.Fatalf("derived key is not a valid key: %v", err)
	}
	if a != DeriveKey("parent", "charge") {
		t.Fatal("derivation is not deterministic")
	}
	for _, other := range []string{DeriveKey("parent", "refund"), DeriveKey("parent2", "charge"), DeriveKey("parent:charge", ""), "parent"} {
		if other == a {
			t.Fatalf("distinct inputs derived the same key %s", a)
		}
	}
}
