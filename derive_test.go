package idem

import (
	"context"
	"testing"

	"github.com/idemkit/idem/store"
)

// TestStepKeyVectors pins the derivation of a step's child key
// (ChildKey): child keys are stored by the services a request calls, so a
// change would make every retry in flight during an upgrade act again. The
// vectors were computed independently, as SHA-256 over tenant, method, key
// and step, each preceded by its length in bytes as a big-endian uint64.
func TestStepKeyVectors(t *testing.T) {
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
		got := stepKey(store.Scope{Tenant: v.tenant, Method: v.method, Key: v.key}, v.step)
		if got != v.want {
			t.Errorf("stepKey(%q, %q, %q, %q) = %s, want %s", v.tenant, v.method, v.key, v.step, got, v.want)
		}
		if err := validateKey(got); err != nil {
			t.Errorf("derived key %s is not a valid key: %v", got, err)
		}
	}
}

// TestCallKeyVectors pins the key of a call that names no step, which is
// stored downstream as a step's are. The vectors were computed
// independently, as SHA-256 over tenant, method, key, "call", the method
// called and the ordinal in decimal, each preceded by its length in bytes
// as a big-endian uint64.
func TestCallKeyVectors(t *testing.T) {
	for _, v := range []struct {
		tenant, method, key, called string
		n                           int
		want                        string
	}{
		{"acme", "/shop.v1.Shop/Checkout", "order-1", "/payments.v1.PaymentService/CreatePayment", 1, "de04c552101d4537f785dfa90c6f00d3d4beaf9cada2e0111865a893aa37613e"},
		{"acme", "/shop.v1.Shop/Checkout", "order-1", "/payments.v1.PaymentService/CreatePayment", 2, "ad8b9dee195f4a5391e11553f73b8e4d9c5c98c94d9d03acc02e22be8719292f"},
		// One key, other tenant, other method.
		{"globex", "/shop.v1.Shop/Checkout", "order-1", "/payments.v1.PaymentService/CreatePayment", 1, "609a6f11ea184f7c3ea404b5a886f97cb3a1754dd91a599db5f238c02a57d72c"},
		{"acme", "/shop.v1.Shop/Refund", "order-1", "/payments.v1.PaymentService/CreatePayment", 1, "d745b0a1df387f02042016d2231d854379f9e12120b7abc147b63429b82d5854"},
		{"", "", "order-7f3a", "/provider.v1.ProviderService/Charge", 1, "4e10c920194e5d44db63e411c26e85f8e6dc19f6d76f206a1a3019b5269f93e2"},
		{"", "", "order-7f3a", "/provider.v1.ProviderService/Charge", 12, "d74f1fff52a6ef479f6a489547fa18967b0f466e9ee84df81abdd3a707ee167e"},
	} {
		parent := store.Scope{Tenant: v.tenant, Method: v.method, Key: v.key}
		got := callKey(parent, v.called, v.n)
		if got != v.want {
			t.Errorf("callKey(%q, %q, %q, %q, %d) = %s, want %s", v.tenant, v.method, v.key, v.called, v.n, got, v.want)
		}
		if err := validateKey(got); err != nil {
			t.Errorf("call key %s is not a valid key: %v", got, err)
		}
	}
}

// TestStepNamesNeverMeetCallKeys: a step named as a call's method and
// ordinal, as the client interceptor once derived plain calls' keys, or as
// the parts of a call's tuple, derives a key of its own.
func TestStepNamesNeverMeetCallKeys(t *testing.T) {
	parent := store.Scope{Tenant: "acme", Method: "/shop.v1.Shop/Checkout", Key: "order-1"}
	const charge = "/provider.v1.ProviderService/Charge"
	call := callKey(parent, charge, 1)
	for _, step := range []string{charge + "#1", "call", charge, "1", "call" + charge + "1"} {
		if stepKey(parent, step) == call {
			t.Errorf("the step %q derives the key of the first call to %s", step, charge)
		}
	}
	if callKey(parent, charge, 1) == callKey(parent, charge, 2) || callKey(parent, charge+"#1", 2) == callKey(parent, charge, 12) {
		t.Error("two calls share a key")
	}
}

func TestChildKey(t *testing.T) {
	if k, ok := ChildKey(context.Background(), "charge"); ok || k != "" {
		t.Fatalf("ChildKey outside a keyed request = %q, %v; want \"\", false", k, ok)
	}
	parent := store.Scope{Tenant: "acme", Method: "/shop.v1.Shop/Checkout", Key: "order-1"}
	ctx := withRequestKey(context.Background(), parent, nil)
	k, ok := ChildKey(ctx, "charge")
	if !ok || k != stepKey(parent, "charge") {
		t.Fatalf("ChildKey = %q, %v; want %s, true", k, ok, stepKey(parent, "charge"))
	}
	if key, ok := KeyFromContext(ctx); !ok || key != "order-1" {
		t.Fatalf("KeyFromContext = %q, %v; want order-1, true", key, ok)
	}
}
