package admin_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/admin"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/store"
)

// consoleServer serves the console of a Server over st, authorized by
// authz, at /console/ as the package's doc mounts it, and returns the
// console's URL.
func consoleServer(t *testing.T, st store.Admin, authz admin.Authorizer, opts ...admin.Option) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", admin.NewConsole(admin.NewServer(st, authz, opts...))))
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts.URL + "/console/"
}

// noRedirects is a client that returns redirects rather than follow them.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// page GETs u and returns its status and body.
func page(t *testing.T, u string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := noRedirects.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusSeeOther {
		return resp.StatusCode, resp.Header.Get("Location")
	}
	return resp.StatusCode, string(b)
}

// post POSTs form to u as a browser does from the console's own page:
// same origin.
func post(t *testing.T, u string, form url.Values, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, u, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return do(t, req)
}

// resolve returns the link ref of the page at base as a URL.
func resolve(t *testing.T, base, ref string) string {
	t.Helper()
	b, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	r, err := url.Parse(ref)
	if err != nil {
		t.Fatal(err)
	}
	return b.ResolveReference(r).String()
}

func keyForm(k store.Scope, more ...string) url.Values {
	v := url.Values{"tenant": {k.Tenant}, "method": {k.Method}, "key": {k.Key}}
	for i := 0; i+1 < len(more); i += 2 {
		v.Set(more[i], more[i+1])
	}
	return v
}

func keyQuery(k store.Scope) string { return keyForm(k).Encode() }

// hrefs returns the links of a page, unescaped.
func hrefs(body string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`href="([^"]*)"`).FindAllStringSubmatch(body, -1) {
		out = append(out, strings.ReplaceAll(m[1], "&amp;", "&"))
	}
	return out
}

func (f *fakeStore) has(k store.Scope) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.find(k) >= 0
}

func (f *fakeStore) get(k store.Scope) store.KeyInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.keys[f.find(k)]
}

// TestConsoleList lists the keys with the filters, and pages through them
// with the page links, a filter by age included, at a path prefix.
func TestConsoleList(t *testing.T) {
	now := time.Now()
	st := &fakeStore{now: now}
	for i := range 60 {
		st.keys = append(st.keys, info("acme", doMethod, fmt.Sprintf("order-%02d", i), store.Recorded, now.Add(-time.Duration(120-i)*time.Minute)))
	}
	st.keys = append(st.keys,
		info("globex", doMethod, "stuck-1", store.Abandoned, now.Add(-3*time.Hour)),
		info("globex", "/other.v1.S/M", "fresh-1", store.InProgress, now.Add(-time.Minute)))
	u := consoleServer(t, st, allowAll)

	status, body := page(t, u)
	if status != http.StatusOK || !strings.Contains(body, "order-00") || !strings.Contains(body, "order-49") || strings.Contains(body, "order-50") {
		t.Fatalf("first page: %d\n%s", status, body)
	}
	if st.lastKeys.AllTenants != true || st.lastKeys.Limit != 50 {
		t.Errorf("a first visit lists %+v, want every tenant, 50 keys", st.lastKeys)
	}

	// The filter: one tenant, one state.
	status, body = page(t, u+"?f=1&tenant=globex&state=abandoned")
	if status != http.StatusOK || !strings.Contains(body, "stuck-1") || strings.Contains(body, "fresh-1") || strings.Contains(body, "order-") {
		t.Fatalf("globex's abandoned keys: %d\n%s", status, body)
	}
	if st.lastKeys.Tenant != "globex" || st.lastKeys.AllTenants || !slices.Equal(st.lastKeys.States, []store.State{store.Abandoned}) {
		t.Errorf("filter asked of the store: %+v", st.lastKeys)
	}
	// A link that names a tenant, without the form's f.
	status, body = page(t, u+"?tenant=globex")
	if status != http.StatusOK || !strings.Contains(body, "stuck-1") || strings.Contains(body, "order-") || st.lastKeys.AllTenants {
		t.Fatalf("?tenant=globex: %d, filter %+v\n%s", status, st.lastKeys, body)
	}
	status, body = page(t, u+"?f=1&all=1&method="+url.QueryEscape("/other.v1.S/M"))
	if status != http.StatusOK || !strings.Contains(body, "fresh-1") || strings.Contains(body, "stuck-1") {
		t.Fatalf("by method: %d\n%s", status, body)
	}

	// Older than 30 minutes: order-00 to order-89 minus the last 30, paged.
	status, body = page(t, u+"?f=1&tenant=acme&older=90m")
	if status != http.StatusOK || st.lastKeys.CreatedBefore.IsZero() || !strings.Contains(body, "order-00") {
		t.Fatalf("older than 90m: %d, filter %+v\n%s", status, st.lastKeys, body)
	}
	before := st.lastKeys.CreatedBefore
	var next string
	for _, h := range hrefs(body) {
		if strings.Contains(h, "page=") {
			next = h
		}
	}
	if next == "" {
		t.Fatalf("no next page link on a full page:\n%s", body)
	}
	status, body = page(t, resolve(t, u, next))
	// order-50 to order-59 are newer than 90 minutes: none of them; the
	// first page held order-00..49 and the rest were made 70..61 minutes
	// ago.
	if status != http.StatusOK || !st.lastKeys.CreatedBefore.Equal(before) || strings.Contains(body, "order-49") {
		t.Fatalf("next page: %d, filter %+v (want before %v)\n%s", status, st.lastKeys, before, body)
	}
	if !strings.Contains(body, "First page") {
		t.Errorf("the second page has no link to the first:\n%s", body)
	}

	status, body = page(t, u+"?f=1&older=soon")
	if status != http.StatusBadRequest || !strings.Contains(body, "is not an age") {
		t.Errorf("a bad age: %d\n%s", status, body)
	}
	status, body = page(t, u+"?f=1&all=1&page=forged")
	if status != http.StatusBadRequest || !strings.Contains(body, "page token is invalid") {
		t.Errorf("a forged page token: %d\n%s", status, body)
	}
}

// TestConsoleKeyPage shows a key: its state, lease, steps and decoded
// outcome.
func TestConsoleKeyPage(t *testing.T) {
	now := time.Now()
	paid := info("acme", doMethod, "paid", store.Recorded, now.Add(-time.Hour))
	paid.Outcome = recordedWithRequest(t, code.Code_OK, &testv1.DoResponse{Value: "paid-42", Execution: 3}, &testv1.DoRequest{Value: "pay-42"})
	paid.Replays, paid.LastReplay = 7, now.Add(-2*time.Minute)
	failed := info("acme", doMethod, "failed", store.Recorded, now.Add(-time.Hour))
	detail, err := anypb.New(&errdetails.ErrorInfo{Reason: "CUSTOMER_UNKNOWN", Domain: "payments.example"})
	if err != nil {
		t.Fatal(err)
	}
	failed.Outcome = recorded(t, code.Code_NOT_FOUND, &spb.Status{Code: int32(code.Code_NOT_FOUND), Message: "no such customer", Details: []*anypb.Any{detail}})
	leased := info("acme", doMethod, "leased", store.InProgress, now.Add(-time.Minute))
	leased.LeaseUntil = now.Add(time.Minute)
	leased.Steps = []store.Step{{Name: "charge", Result: []byte("ch_123")}, {Name: "blob", Result: []byte{0xff, 0x00}}}
	leased.Takeovers = 2
	st := &fakeStore{now: now, keys: []store.KeyInfo{paid, failed, leased}}
	u := consoleServer(t, st, allowAll)

	status, body := page(t, u+"key?"+keyQuery(paid.Scope))
	for _, want := range []string{"recorded", "paid-42", "\n  &#34;execution&#34;: &#34;3&#34;,\n", "idem.test.v1.DoResponse", "feed",
		"<dt>Replays</dt><dd>7, the last", "(2m ago)", "Request type <code>idem.test.v1.DoRequest</code>", "pay-42"} {
		if !strings.Contains(body, want) {
			t.Errorf("recorded key's page lacks %q", want)
		}
	}
	if status != http.StatusOK || !strings.Contains(body, `href="forget?`) || strings.Contains(body, `href="settle?`) {
		t.Errorf("recorded key's page: %d, want a forget and no settle\n%s", status, body)
	}
	_, body = page(t, u+"key?"+keyQuery(failed.Scope))
	if !strings.Contains(body, "NOT_FOUND") || !strings.Contains(body, "no such customer") || !strings.Contains(body, "google.rpc.ErrorInfo") {
		t.Errorf("failed key's page:\n%s", body)
	}
	_, body = page(t, u+"key?"+keyQuery(leased.Scope))
	for _, want := range []string{"in progress", "live", "charge", "ch_123", "2 bytes, base64:", "/wA=", `href="settle?`, "No outcome recorded: the call has not finished",
		"<dt>Replays</dt><dd>0</dd>", "No request kept"} {
		if !strings.Contains(body, want) {
			t.Errorf("leased key's page lacks %q\n%s", want, body)
		}
	}
	status, body = page(t, u+"key?"+keyQuery(store.Scope{Tenant: "acme", Method: doMethod, Key: "nope"}))
	if status != http.StatusNotFound || !strings.Contains(body, "NOT_FOUND") {
		t.Errorf("unknown key: %d\n%s", status, body)
	}
}

// TestConsoleForget forgets a key through its confirmation page: without
// a reason it is refused and the key kept; with one, it is forgotten and
// the list says so. A live lease needs force.
func TestConsoleForget(t *testing.T) {
	now := time.Now()
	k := info("acme", doMethod, "order-7", store.Recorded, now.Add(-time.Hour))
	leased := info("acme", doMethod, "order-8", store.InProgress, now.Add(-time.Minute))
	leased.LeaseUntil = now.Add(time.Hour)
	st := &fakeStore{now: now, keys: []store.KeyInfo{k, leased}}
	u := consoleServer(t, st, allowAll)

	status, body := page(t, u+"forget?"+keyQuery(k.Scope))
	if status != http.StatusOK || !strings.Contains(body, `<form class="confirm" method="post" action="forget">`) ||
		!strings.Contains(body, `name="reason"`) || !strings.Contains(body, "order-7") {
		t.Fatalf("confirmation page: %d\n%s", status, body)
	}
	if !st.has(k.Scope) {
		t.Fatal("the confirmation page forgot the key")
	}

	for _, reason := range []string{"", "  \n "} {
		status, body = post(t, u+"forget", keyForm(k.Scope, "reason", reason))
		if status != http.StatusBadRequest || !strings.Contains(body, "a reason is required") || !strings.Contains(body, `name="reason"`) {
			t.Errorf("forget with reason %q: %d\n%s", reason, status, body)
		}
	}
	status, _ = post(t, u+"forget", keyForm(k.Scope, "reason", strings.Repeat("x", store.MaxReasonLength+1)))
	if status != http.StatusBadRequest {
		t.Errorf("forget with a reason too long: %d", status)
	}
	if !st.has(k.Scope) {
		t.Fatal("a forget without a valid reason forgot the key")
	}

	status, loc := post(t, u+"forget", keyForm(k.Scope, "reason", "INC-42: replay a stale payment"))
	if status != http.StatusSeeOther || !strings.HasPrefix(loc, "./?") {
		t.Fatalf("forget: %d %q, want a redirect to the list", status, loc)
	}
	if st.has(k.Scope) {
		t.Fatal("the key was not forgotten")
	}
	_, body = page(t, resolve(t, u, loc))
	if !strings.Contains(body, "Forgot the key order-7") || strings.Contains(body, `>order-7</a>`) {
		t.Errorf("the list after the forget:\n%s", body)
	}
	// The audit trail keeps the forget with its reason and operator, and
	// the forgotten key's page shows it.
	audit := st.auditEntries()
	if len(audit) != 1 || audit[0].Scope != k.Scope || audit[0].Action != store.ActionForget || audit[0].Reason != "INC-42: replay a stale payment" ||
		audit[0].Operator != "root" || audit[0].Before != store.Recorded || audit[0].Force || audit[0].Peer == "" {
		t.Fatalf("audit trail after the forget: %+v", audit)
	}
	var history string
	if m := regexp.MustCompile(`<a href="([^"]*)">Its history</a>`).FindStringSubmatch(body); m != nil {
		history = strings.ReplaceAll(m[1], "&amp;", "&")
	}
	status, body = page(t, resolve(t, u, history))
	if status != http.StatusNotFound || !strings.Contains(body, "INC-42: replay a stale payment") || !strings.Contains(body, "recorded → forgotten") ||
		!strings.Contains(body, "<td>root</td>") {
		t.Errorf("the forgotten key's history (%q): %d\n%s", history, status, body)
	}

	// A live lease: refused, named, kept; forced, forgotten.
	status, body = post(t, u+"forget", keyForm(leased.Scope, "reason", "stuck"))
	if status != http.StatusConflict || !strings.Contains(body, "lease is live until") || !st.has(leased.Scope) {
		t.Errorf("forget of a live lease: %d\n%s", status, body)
	}
	if status, _ = post(t, u+"forget", keyForm(leased.Scope, "reason", "stuck", "force", "1")); status != http.StatusSeeOther || st.has(leased.Scope) {
		t.Errorf("forced forget of a live lease: %d, key kept %v", status, st.has(leased.Scope))
	}
	if audit = st.auditEntries(); len(audit) != 2 || !audit[1].Force || audit[1].Reason != "stuck" || audit[1].Before != store.InProgress {
		t.Errorf("audit trail after the forced forget: %+v", audit)
	}
}

// TestConsoleSettleAndFinish settles an abandoned key with an error and a
// reason; finish without a finisher shows UNIMPLEMENTED.
func TestConsoleSettleAndFinish(t *testing.T) {
	now := time.Now()
	k := info("acme", doMethod, "order-9", store.Abandoned, now.Add(-time.Hour))
	k.LeaseUntil = now.Add(-time.Minute)
	k.Call = &store.Call{}
	st := &fakeStore{now: now, keys: []store.KeyInfo{k}}
	u := consoleServer(t, st, allowAll)

	_, body := page(t, u+"key?"+keyQuery(k.Scope))
	for _, want := range []string{`href="finish?`, `href="settle?`, `href="forget?`} {
		if !strings.Contains(body, want) {
			t.Errorf("an abandoned finishable key's page lacks %s", want)
		}
	}
	status, body := page(t, u+"settle?"+keyQuery(k.Scope))
	if status != http.StatusOK || !strings.Contains(body, "<option selected>FAILED_PRECONDITION</option>") || strings.Contains(body, "<option>UNAVAILABLE</option>") {
		t.Fatalf("settle's confirmation page: %d\n%s", status, body)
	}
	status, _ = post(t, u+"settle", keyForm(k.Scope, "code", "FAILED_PRECONDITION", "message", "refunded by hand"))
	if status != http.StatusBadRequest || st.get(k.Scope).State != store.Abandoned {
		t.Fatalf("settle without a reason: %d, state %s", status, st.get(k.Scope).State)
	}
	status, body = post(t, u+"settle", keyForm(k.Scope, "code", "UNAVAILABLE", "message", "m", "reason", "r"))
	if status != http.StatusBadRequest || !strings.Contains(body, "a code clients retry") || st.get(k.Scope).State != store.Abandoned {
		t.Fatalf("settle with UNAVAILABLE: %d\n%s", status, body)
	}
	status, loc := post(t, u+"settle", keyForm(k.Scope, "code", "FAILED_PRECONDITION", "message", "refunded by hand", "reason", "INC-7"))
	if status != http.StatusSeeOther || !strings.HasPrefix(loc, "key?") {
		t.Fatalf("settle: %d %q", status, loc)
	}
	got := st.get(k.Scope)
	if got.State != store.Recorded || got.Outcome == nil || got.Outcome.Code != code.Code_FAILED_PRECONDITION {
		t.Fatalf("settled key: %+v", got)
	}
	_, body = page(t, resolve(t, u, loc))
	if !strings.Contains(body, "Settled the key.") || !strings.Contains(body, "refunded by hand") ||
		!strings.Contains(body, "<td>settle</td>") || !strings.Contains(body, "INC-7") || !strings.Contains(body, "abandoned → recorded") {
		t.Errorf("the key after the settle:\n%s", body)
	}
	if audit := st.auditEntries(); len(audit) != 1 || audit[0].Action != store.ActionSettle || audit[0].Reason != "INC-7" || audit[0].After != store.Recorded {
		t.Errorf("audit trail after the settle: %+v", audit)
	}

	status, body = post(t, u+"finish", keyForm(k.Scope, "reason", "finish it"))
	if status != http.StatusNotImplemented || !strings.Contains(body, "no finisher") {
		t.Errorf("finish without a finisher: %d\n%s", status, body)
	}
}

// TestConsoleCrossOrigin refuses a POST from another origin (CSRF), and
// leaves the key.
func TestConsoleCrossOrigin(t *testing.T) {
	k := info("acme", doMethod, "order-1", store.Recorded, epoch)
	st := &fakeStore{keys: []store.KeyInfo{k}}
	u := consoleServer(t, st, allowAll)
	form := keyForm(k.Scope, "reason", "csrf", "force", "1")
	for name, header := range map[string][]string{
		"cross-site":     {"Sec-Fetch-Site", "cross-site"},
		"same-site":      {"Sec-Fetch-Site", "same-site"},
		"another origin": {"Sec-Fetch-Site", "", "Origin", "https://evil.example"},
	} {
		status, body := post(t, u+"forget", form, header...)
		if status != http.StatusForbidden || !strings.Contains(body, "cross-origin request refused") {
			t.Errorf("%s: %d\n%s", name, status, body)
		}
	}
	if !st.has(k.Scope) || st.storeCalls() != 0 {
		t.Fatalf("a cross-origin POST reached the store (%d calls)", st.storeCalls())
	}
	if status, _ := post(t, u+"forget", form); status != http.StatusSeeOther || st.has(k.Scope) {
		t.Fatalf("the same POST from the console's origin: %d", status)
	}
}

// TestConsoleAuthorization: each page is authorized by the Server's
// Authorizer, with the browser's headers and the RPC's name; a refusal is
// a 401 or 403 page with the authorizer's message, and nothing done.
func TestConsoleAuthorization(t *testing.T) {
	k := info("acme", doMethod, "order-1", store.Recorded, epoch)
	st := &fakeStore{keys: []store.KeyInfo{k}}
	var (
		mu   sync.Mutex
		seen []admin.Request
	)
	authz := admin.AuthorizerFunc(func(_ context.Context, r admin.Request) (admin.Grant, error) {
		mu.Lock()
		seen = append(seen, r)
		mu.Unlock()
		switch v := r.Header["authorization"]; {
		case len(v) == 0:
			return admin.Grant{}, idem.NewError(code.Code_UNAUTHENTICATED, "sign in first")
		case v[0] == "Bearer reader" && !strings.HasSuffix(r.Method, "Key") || v[0] == "Bearer reader" && strings.HasSuffix(r.Method, "/GetKey"):
			return admin.Grant{Subject: "reader", AllTenants: true}, nil
		case v[0] == "Bearer globex":
			return admin.Grant{Subject: "globex-help", Tenants: []string{"globex"}}, nil
		case v[0] == "Bearer oops":
			return admin.Grant{}, errors.New("the identity provider's secret detail")
		}
		return admin.Grant{}, idem.NewError(code.Code_PERMISSION_DENIED, "read-only operator")
	})
	u := consoleServer(t, st, authz)

	status, body := page(t, u)
	if status != http.StatusUnauthorized || !strings.Contains(body, "sign in first") {
		t.Errorf("no credentials: %d\n%s", status, body)
	}
	status, body = page(t, u, "Authorization", "Bearer globex")
	if status != http.StatusForbidden || !strings.Contains(body, "name a tenant") || !strings.Contains(body, `name="tenant"`) {
		t.Errorf("all tenants for a one-tenant operator: %d\n%s", status, body)
	}
	status, body = page(t, u+"key?"+keyQuery(k.Scope), "Authorization", "Bearer globex")
	if status != http.StatusForbidden || !strings.Contains(body, `tenant &#34;acme&#34; is not allowed`) {
		t.Errorf("another tenant's key: %d\n%s", status, body)
	}
	status, body = page(t, u, "Authorization", "Bearer oops")
	if status != http.StatusForbidden || strings.Contains(body, "secret detail") {
		t.Errorf("an authorizer's plain error: %d\n%s", status, body)
	}
	if status, _ = page(t, u+"key?"+keyQuery(k.Scope), "Authorization", "Bearer reader"); status != http.StatusOK {
		t.Errorf("the reader's key page: %d", status)
	}
	status, body = post(t, u+"forget", keyForm(k.Scope, "reason", "r"), "Authorization", "Bearer reader")
	if status != http.StatusForbidden || !strings.Contains(body, "read-only operator") {
		t.Errorf("the reader's forget: %d\n%s", status, body)
	}
	if !st.has(k.Scope) {
		t.Fatal("a refused forget forgot the key")
	}

	mu.Lock()
	defer mu.Unlock()
	var forget *admin.Request
	for i := range seen {
		if seen[i].Method == "/idem.admin.v1.AdminService/ForgetKey" {
			forget = &seen[i]
		}
	}
	if forget == nil || forget.Key != k.Scope || forget.Header["authorization"][0] != "Bearer reader" || forget.Header["sec-fetch-site"][0] != "same-origin" {
		t.Errorf("the authorizer saw the forget as %+v", forget)
	}
}

// TestConsoleEscapes shows a key whose name and outcome hold HTML as text.
func TestConsoleEscapes(t *testing.T) {
	const evil = `<script>alert("k")</script>`
	k := info(`<b>acme</b>`, doMethod, evil, store.Recorded, epoch)
	k.Outcome = recorded(t, code.Code_OK, &testv1.DoResponse{Value: `<img src=x onerror=alert(1)>`})
	k.Steps = []store.Step{{Name: `<i>step</i>`, Result: []byte(`<script>x</script>`)}}
	st := &fakeStore{keys: []store.KeyInfo{k}}
	u := consoleServer(t, st, allowAll)
	for _, p := range []string{"", "key?" + keyQuery(k.Scope), "forget?" + keyQuery(k.Scope)} {
		status, body := page(t, u+p)
		if status != http.StatusOK {
			t.Fatalf("%q: %d\n%s", p, status, body)
		}
		for _, raw := range []string{"<script>", "<b>acme", "<img", "<i>step"} {
			if strings.Contains(body, raw) {
				t.Errorf("%q holds %s unescaped:\n%s", p, raw, body)
			}
		}
		if !strings.Contains(body, "&lt;script&gt;") {
			t.Errorf("%q does not show the key as text", p)
		}
	}
	status, body := post(t, u+"forget", keyForm(k.Scope, "reason", `<script>r</script>`))
	if status != http.StatusSeeOther || st.has(k.Scope) {
		t.Fatalf("forget of the key: %d %s", status, body)
	}
	_, body = page(t, resolve(t, u, body))
	if strings.Contains(body, "<script>") || !strings.Contains(body, "Forgot the key &lt;script&gt;") {
		t.Errorf("the notice of the forget:\n%s", body)
	}
}

// TestConsoleStoreErrorHidden shows a store's failure without its text.
func TestConsoleStoreErrorHidden(t *testing.T) {
	st := &fakeStore{err: errors.New(`ERROR: SELECT state FROM idempotency_keys (SQLSTATE 57014)`)}
	u := consoleServer(t, st, allowAll, admin.WithLogger(slog.New(slog.DiscardHandler)))
	k := store.Scope{Tenant: "acme", Method: doMethod, Key: "k"}
	for name, get := range map[string]func() (int, string){
		"list":   func() (int, string) { return page(t, u) },
		"key":    func() (int, string) { return page(t, u+"key?"+keyQuery(k)) },
		"forget": func() (int, string) { return post(t, u+"forget", keyForm(k, "reason", "r")) },
	} {
		status, body := get()
		if status != http.StatusServiceUnavailable || !strings.Contains(body, "the store failed") || strings.Contains(body, "SELECT") || strings.Contains(body, "SQLSTATE") {
			t.Errorf("%s: %d\n%s", name, status, body)
		}
	}
}

// TestConsolePrefix follows every link of the console's pages, mounted at
// /ops/idem/: each resolves under the prefix, to a page that answers.
func TestConsolePrefix(t *testing.T) {
	k := info("acme", doMethod, "a/b?c=d&e", store.Abandoned, epoch)
	k.Call = &store.Call{}
	st := &fakeStore{keys: []store.KeyInfo{k}}
	mux := http.NewServeMux()
	mux.Handle("/ops/idem/", http.StripPrefix("/ops/idem/", admin.NewConsole(admin.NewServer(st, allowAll))))
	ts := httptest.NewServer(mux)
	defer ts.Close()
	start, _ := url.Parse(ts.URL + "/ops/idem/")
	seen := map[string]bool{}
	queue := []*url.URL{start}
	for len(queue) > 0 {
		u := queue[0]
		queue = queue[1:]
		if seen[u.String()] {
			continue
		}
		seen[u.String()] = true
		if !strings.HasPrefix(u.Path, "/ops/idem/") {
			t.Errorf("a link leaves the prefix: %s", u)
			continue
		}
		status, body := page(t, u.String())
		if status != http.StatusOK {
			t.Errorf("%s: %d\n%s", u, status, body)
			continue
		}
		for _, h := range hrefs(body) {
			rel, err := url.Parse(h)
			if err != nil {
				t.Errorf("%s links to %q: %v", u, h, err)
				continue
			}
			queue = append(queue, u.ResolveReference(rel))
		}
	}
	for _, want := range []string{"/ops/idem/style.css", "/ops/idem/key?", "/ops/idem/forget?", "/ops/idem/settle?", "/ops/idem/finish?"} {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(seen)), func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("no page links to %s; seen %v", want, seen)
		}
	}
	// The key page's form posts to a relative action, under the prefix.
	status, loc := post(t, ts.URL+"/ops/idem/forget", keyForm(k.Scope, "reason", "r"))
	if status != http.StatusSeeOther || st.has(k.Scope) {
		t.Fatalf("forget under the prefix: %d %s", status, loc)
	}
	resp, err := http.Get(ts.URL + "/ops/idem/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for name, want := range map[string]string{
		"Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
		"X-Frame-Options":         "DENY",
		"Cache-Control":           "no-store",
		"Content-Type":            "text/html; charset=utf-8",
	} {
		if got := resp.Header.Get(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if status, _ := page(t, ts.URL+"/ops/idem/nowhere"); status != http.StatusNotFound {
		t.Errorf("an unknown page: %d", status)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodDelete, ts.URL+"/ops/idem/forget", nil)
	if status, _ := do(t, req); status != http.StatusMethodNotAllowed {
		t.Errorf("DELETE: %d", status)
	}
}

// TestConsoleReadOnly: a read-only grant sees a key and its history, and
// no action: the key's page has no action buttons, an action's
// confirmation page no form, and its POST is refused, the key kept.
func TestConsoleReadOnly(t *testing.T) {
	k := info("acme", doMethod, "order-1", store.Abandoned, epoch)
	st := &fakeStore{keys: []store.KeyInfo{k}}
	viewer := admin.AuthorizerFunc(func(context.Context, admin.Request) (admin.Grant, error) {
		return admin.Grant{Subject: "viewer", AllTenants: true, ReadOnly: true}, nil
	})
	u := consoleServer(t, st, viewer)

	status, body := page(t, u+"key?"+keyQuery(k.Scope))
	if status != http.StatusOK || !strings.Contains(body, "order-1") || !strings.Contains(body, "<h2>History</h2>") {
		t.Fatalf("the viewer's key page: %d\n%s", status, body)
	}
	for _, a := range []string{"forget", "settle", "finish"} {
		if strings.Contains(body, `href="`+a+`?`) {
			t.Errorf("the viewer's key page offers %s", a)
		}
		status, body := page(t, u+a+"?"+keyQuery(k.Scope))
		if status != http.StatusForbidden || strings.Contains(body, "<form") && strings.Contains(body, `method="post"`) || !strings.Contains(body, "may not") {
			t.Errorf("the viewer's %s page: %d\n%s", a, status, body)
		}
		status, body = post(t, u+a, keyForm(k.Scope, "reason", "r", "code", "FAILED_PRECONDITION", "message", "m"))
		if status != http.StatusForbidden || !strings.Contains(body, "read-only") {
			t.Errorf("the viewer's %s: %d\n%s", a, status, body)
		}
	}
	if !st.has(k.Scope) || st.get(k.Scope).State != store.Abandoned || len(st.auditEntries()) != 0 {
		t.Fatalf("a read-only operator changed the key: %+v, audit %+v", st.get(k.Scope), st.auditEntries())
	}
}

// TestConsoleCounts shows the counts of the keys the list's filter
// selects: of the keys in progress by default, of every state on demand,
// each count a link to those keys, with the oldest stuck keys.
func TestConsoleCounts(t *testing.T) {
	now := time.Now()
	st := &fakeStore{now: now, keys: []store.KeyInfo{
		info("acme", doMethod, "r-1", store.Recorded, now.Add(-3*time.Hour)),
		info("acme", doMethod, "r-2", store.Recorded, now.Add(-2*time.Hour)),
		info("acme", doMethod, "gone-1", store.Abandoned, now.Add(-time.Hour)),
		info("globex", "/other.v1.S/M", "busy-1", store.InProgress, now.Add(-time.Minute)),
	}}
	u := consoleServer(t, st, allowAll)

	status, body := page(t, u)
	cells := regexp.MustCompile(`<td class="num">(?:<a href="([^"]*)">)?(?:<span class="none">)?(\d+)`)
	counts := func(body string) (out []string, links []string) {
		table := regexp.MustCompile(`(?s)<table class="counts">.*?</table>`).FindString(body)
		for _, m := range cells.FindAllStringSubmatch(table, -1) {
			out = append(out, m[2])
			links = append(links, strings.ReplaceAll(m[1], "&amp;", "&"))
		}
		return out, links
	}
	got, links := counts(body)
	// Rows acme Do, globex M, and the total; columns in progress,
	// abandoned, total.
	if want := []string{"0", "1", "1", "1", "0", "1", "1", "1", "2"}; status != http.StatusOK || !slices.Equal(got, want) {
		t.Fatalf("counts of the keys in progress: %d %v, want %v\n%s", status, got, want, body)
	}
	if !strings.Contains(body, `Oldest abandoned: <a class="key" href="key?key=gone-1&amp;`) || !strings.Contains(body, `Oldest in progress: <a class="key" href="key?key=busy-1&amp;`) {
		t.Errorf("the oldest stuck keys are not shown:\n%s", body)
	}
	// The abandoned count of acme lists that key.
	status, body = page(t, resolve(t, u, links[1]))
	if status != http.StatusOK || !strings.Contains(body, ">gone-1</a>") || strings.Contains(body, ">r-1</a>") || strings.Contains(body, ">busy-1</a>") {
		t.Errorf("the abandoned keys of acme (%s): %d\n%s", links[1], status, body)
	}

	all := regexp.MustCompile(`<a href="([^"]*)">count every state</a>`).FindStringSubmatch(body)
	if all != nil {
		t.Errorf("a filter that names a state offers to count every state:\n%s", body)
	}
	_, body = page(t, u)
	all = regexp.MustCompile(`<a href="([^"]*)">count every state</a>`).FindStringSubmatch(body)
	if all == nil {
		t.Fatalf("no link to count every state:\n%s", body)
	}
	_, body = page(t, resolve(t, u, strings.ReplaceAll(all[1], "&amp;", "&")))
	got, _ = counts(body)
	// Columns in progress, abandoned, recorded, expired, total.
	if want := []string{"0", "1", "2", "0", "3", "1", "0", "0", "0", "1", "1", "1", "2", "0", "4"}; !slices.Equal(got, want) {
		t.Errorf("counts of every state: %v, want %v\n%s", got, want, body)
	}
}

// TestConsoleEveryPageAuthorized: every page and action of the console,
// asked by an operator the Authorizer refuses, is a 403 page, and the
// store is never asked.
func TestConsoleEveryPageAuthorized(t *testing.T) {
	k := info("acme", doMethod, "order-1", store.Abandoned, epoch)
	k.Call = &store.Call{}
	st := &fakeStore{keys: []store.KeyInfo{k}}
	var mu sync.Mutex
	asked := map[string]bool{}
	deny := admin.AuthorizerFunc(func(_ context.Context, r admin.Request) (admin.Grant, error) {
		mu.Lock()
		asked[r.Method] = true
		mu.Unlock()
		return admin.Grant{}, idem.NewError(code.Code_PERMISSION_DENIED, "not an operator")
	})
	u := consoleServer(t, st, deny)
	q := keyQuery(k.Scope)
	for _, p := range []string{"", "?f=1&tenant=acme&state=abandoned", "key?" + q, "forget?" + q, "settle?" + q, "finish?" + q} {
		if status, body := page(t, u+p); status != http.StatusForbidden || !strings.Contains(body, "not an operator") {
			t.Errorf("GET %q: %d\n%s", p, status, body)
		}
	}
	for _, a := range []string{"forget", "settle", "finish"} {
		if status, body := post(t, u+a, keyForm(k.Scope, "reason", "r", "force", "1")); status != http.StatusForbidden || !strings.Contains(body, "not an operator") {
			t.Errorf("POST %s: %d\n%s", a, status, body)
		}
	}
	if n := st.storeCalls(); n != 0 {
		t.Errorf("the store was asked %d times for a refused operator", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, rpc := range []string{"ListKeys", "GetKey", "ForgetKey", "SettleKey", "FinishKey"} {
		if !asked["/idem.admin.v1.AdminService/"+rpc] {
			t.Errorf("the Authorizer was never asked about %s", rpc)
		}
	}
}
