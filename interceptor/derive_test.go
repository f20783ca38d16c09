package interceptor

import (
	"context"
	"testing"

	"github.com/idemkit/idem/store"
)

// TestDeriveKeyVectors pins the derivation: child keys are stored by the
// services a request calls, so a change would make every retry in flight
// during an upgrade act again. The vectors were computed independently, as
// SHA-256 over tenant, method, key and step, each preceded by its length in
// bytes as a big-endian uint64.
func TestDeriveKeyVectors(t *testing.T) {
	for _, v := range []struct {
		tenant, method, key, step string
		want                      string
	}{
		{"", "", "order-7f3a", "charge", "517b279f499c850c03625f2035c22ebb4ef93ef8ae3ceffbd4125c2ac59c3f84"},
		{"acme", "/payments.v1.PaymentService/CreatePayment", "order-1", "charge", "ca0dc67c066a6583e26917b58110b908a519d01d9b7e85c1d4df2d792a9271dd"},
		// One key, other tenant, other method.
		{"acme", "/shop.v1.Shop/Checkout", "order-1", "/payments.v1.PaymentService/CreatePayment#1", "335b470bab8a154faec0cca516d39de4c8d7226e4e2f9a79bbe974ed0d6ecb8c"},
		{"globex", "/shop.v1.Shop/Checkout", "order-1", "/payments.v1.PaymentService/CreatePayment#1", "5c8f642557ef826e2c3a533924298eb3b3e861a0750c6014907af58b4e368383"},
		{"acme", "/shop.v1.Shop/Refund", "order-1", "/payments.v1.PaymentService/CreatePayment#1", "9caa7579af2c9aa8cb8a9bc9e739868a9189571a61ef26643b9fab326f9a63e6"},
		// Lengths count bytes, not runes.
		{"m\u00fcller", "/shop.v1.Shop/Checkout", "order-1", "charge", "8b81c106680d5336b2a9eaf0f2a6ecb02173e7e15506f7340e91c3d4f3df0e75"},
		// Pairs that one string joined with separators would confuse.
		{"a", "b:c", "k", "s", "17b5d79fad2d0e19eb926ce09ec84d215f761c008f9416183e911ad59f58d404"},
		{"a:b", "c", "k", "s", "3b6220e3387c3ec9470cb56bbf5b7f42552aed53629dcf5140ddb351273d55c7"},
		{"a\x00b", "c", "k", "s", "bb6c9302de93425e977913aa34b9f8c54f37138d792e26c09e6281a1df7b012c"},
		{"a", "b\x00c", "k", "s", "2ce43d439880d87a46ddbf08af3c8eaaeb74ec4099f710d91fa9fd4856ee4b9e"},
		{"", "", "ab", "c", "bca6d5867f1feb97377005eaa129dd63548e960d79900104536547662a6166f2"},
		{"", "", "a", "bc", "7c4ff6dd98544c2b4a1cc09ada22bf114b5d5f28fbcd8f8d52cf1bfc4343e817"},
		{"", "", "parent:charge", "", "a994ccfff0b009ecc3e60d2b4557bad6ff7d57d0276c32aa4f93cbe284bcd5ba"},
		{"", "", "parent", "charge", "471136eba5a40cb66c71d74c289eb49ddcc87b2eb994bd0c3443928bcd02ec40"},
	} {
		got := DeriveKey(store.Key{Tenant: v.tenant, Method: v.method, Key: v.key}, v.step)
		if got != v.want {
			t.Errorf("DeriveKey(%q, %q, %q, %q) = %s, want %s", v.tenant, v.method, v.key, v.step, got, v.want)
		}
		if err := ValidateKey(got); err != nil {
			t.Errorf("derived key %s is not a valid key: %v", got, err)
		}
	}
}

func TestChildKey(t *testing.T) {
	if k, ok := ChildKey(context.Background(), "charge"); ok || k != "" {
		t.Fatalf("ChildKey outside a keyed request = %q, %v; want \"\", false", k, ok)
	}
	parent := store.Key{Tenant: "acme", Method: "/shop.v1.Shop/Checkout", Key: "order-1"}
	ctx := withRequestKey(context.Background(), parent)
	k, ok := ChildKey(ctx, "charge")
	if !ok || k != DeriveKey(parent, "charge") {
		t.Fatalf("ChildKey = %q, %v; want %s, true", k, ok, DeriveKey(parent, "charge"))
	}
	if key, ok := KeyFromContext(ctx); !ok || key != "order-1" {
		t.Fatalf("KeyFromContext = %q, %v; want order-1, true", key, ok)
	}
}
