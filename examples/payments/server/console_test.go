package main

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/internal/adminlisten"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

// screenshotsEnv names a directory the console's browser test writes
// screenshots of its pages to, when set: the README's Operations pages
// show them (docs/images; see docs/operations.md).
const screenshotsEnv = "IDEM_CONSOLE_SCREENSHOTS"

// chromium returns the path of the Chromium the browser test drives, or
// fails t saying how to install it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium to test the admin console in: install Debian's chromium (apt-get install -y chromium), as .ci/run does, or put chromium, chromium-browser or google-chrome in PATH")
	return ""
}

// TestConsoleInBrowser drives the admin console of the payments server in
// a headless Chromium, as an operator would: the list shows the keys of
// the payments made, and their counts; the operator opens one, forgets it
// with a reason from its confirmation page, and the list no longer shows
// it, nor the store holds it; the key's history shows the forget, who made
// it and why, as the store's audit trail keeps it.
func TestConsoleInBrowser(t *testing.T) {
	browser := chromium(t)
	dsn := pgtest.NewDatabase(t)
	lis, consoleLis := listen(t), listen(t)
	serveAdmin(t, lis, nil, nil, &adminConfig{console: consoleLis, token: "s3cret"}, dsn)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	// Payments of two tenants, recorded; and, for the screenshots, a call
	// in progress and one whose caller vanished, as a leased method's
	// would be.
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	payments := paymentsv1.NewPaymentServiceClient(conn)
	for _, p := range []struct{ tenant, key string }{
		{"acme", "order-1001"}, {"acme", "order-1002"}, {"acme", "order-1003"}, {"globex", "inv-77"},
	} {
		keyed := metadata.AppendToOutgoingContext(ctx, idem.KeyHeader, p.key, "x-tenant-id", p.tenant)
		if _, err := payments.CreatePayment(keyed, &paymentsv1.CreatePaymentRequest{CustomerId: "cus_" + p.tenant, AmountCents: 4200, Currency: "EUR"},
			grpc.WaitForReady(true)); err != nil {
			t.Fatalf("payment %s: %v", p.key, err)
		}
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st := postgres.New(pool)
	const payout = "/payments.v1.PayoutService/CreatePayout"
	live := store.Scope{Tenant: "acme", Method: payout, Key: "payout-9"}
	if _, err := st.ClaimLeased(ctx, live, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	gone := store.Scope{Tenant: "acme", Method: payout, Key: "payout-8"}
	lc, err := st.ClaimLeased(ctx, gone, store.LeaseRequest{Fingerprint: []byte("fp"), Lease: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Lease.SaveStep(ctx, store.Step{Name: "transfer", Result: []byte(`{"transfer_id":"tr_8Kq2"}`)}); err != nil {
		t.Fatal(err)
	}
	// Its caller vanished: the lease runs out.
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET locked_until = now() - interval '1 second' WHERE key = 'payout-8'`); err != nil {
		t.Fatal(err)
	}

	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.WindowSize(1280, 800))...)
	defer cancelAlloc()
	tab, cancelTab := chromedp.NewContext(alloc)
	defer cancelTab()
	if err := chromedp.Do(tab); err != nil {
		t.Fatalf("starting %s: %v", browser, err)
	}
	// The demo authorizer's token, which a person's browser sends as the
	// password of basic authentication.
	if _, err := chromedp.Call(tab, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(tab, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
		Headers: network.Headers{"Authorization": "Bearer s3cret"}}); err != nil {
		t.Fatal(err)
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(tab, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	shoot := func(name string) {
		t.Helper()
		dir := os.Getenv(screenshotsEnv)
		if dir == "" {
			return
		}
		png, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The list: every tenant's keys.
	base := "http://" + consoleLis.Addr().String()
	if err := chromedp.Do(tab, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("table.keys"))); err != nil {
		t.Fatal(err)
	}
	if counts := text("table.counts"); !strings.Contains(counts, "payments.v1.PayoutService/CreatePayout") {
		t.Errorf("the counts lack the payouts in progress:\n%s", counts)
	}
	list := text("table.keys")
	for _, want := range []string{"order-1001", "order-1003", "inv-77", "globex", "payout-9", "in progress", "payout-8", "abandoned", "recorded"} {
		if !strings.Contains(list, want) {
			t.Errorf("the list lacks %q:\n%s", want, list)
		}
	}
	shoot("console-keys.png")

	// The key's page: recorded, with the payment decoded.
	if err := chromedp.Do(tab,
		chromedp.Click(chromedp.Search(`//a[text()="order-1002"]`)),
		chromedp.WaitVisible(chromedp.Search(`//h1[text()="Key order-1002"]`))); err != nil {
		t.Fatal(err)
	}
	key := text("main")
	for _, want := range []string{"recorded", "acme", "/payments.v1.PaymentService/CreatePayment", "OK", "payments.v1.CreatePaymentResponse", `"payment"`} {
		if !strings.Contains(key, want) {
			t.Errorf("the key's page lacks %q:\n%s", want, key)
		}
	}
	shoot("console-key.png")
	// Forget it, with a reason, from its confirmation page.
	if err := chromedp.Do(tab,
		chromedp.Click(chromedp.Search(`//a[text()="Forget…"]`)),
		chromedp.WaitVisible(chromedp.CSS(`textarea[name="reason"]`)),
		chromedp.SendKeys(chromedp.CSS(`textarea[name="reason"]`), "INC-4711: the customer's bank reversed the charge; let the retry run afresh"),
	); err != nil {
		t.Fatal(err)
	}
	shoot("console-forget.png")
	if err := chromedp.Do(tab,
		chromedp.Click(chromedp.CSS(`button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(".notice"))); err != nil {
		t.Fatal(err)
	}
	if n := text(".notice"); !strings.Contains(n, "Forgot the key order-1002") {
		t.Errorf("notice after the forget: %q", n)
	}
	if list = text("table.keys"); strings.Contains(list, "order-1002") || !strings.Contains(list, "order-1001") {
		t.Errorf("the list after the forget:\n%s", list)
	}
	if _, err := st.Key(ctx, store.Scope{Tenant: "acme", Method: "/payments.v1.PaymentService/CreatePayment", Key: "order-1002"}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the store after the forget: %v, want ErrNotFound", err)
	}
	if u, err := chromedp.Run(tab, chromedp.Location()); err != nil || !strings.HasPrefix(u, base+adminlisten.ConsolePath) {
		t.Errorf("the page after the forget is %q (%v), want one under %s", u, err, adminlisten.ConsolePath)
	}

	// The audit trail: the forgotten key's history shows who forgot it,
	// and why.
	if err := chromedp.Do(tab,
		chromedp.Click(chromedp.Search(`//a[text()="Its history"]`)),
		chromedp.WaitVisible(chromedp.CSS("table.audit"))); err != nil {
		t.Fatal(err)
	}
	history := text("table.audit")
	for _, want := range []string{"forget", "operator-token", "INC-4711: the customer's bank reversed the charge", "recorded → forgotten"} {
		if !strings.Contains(history, want) {
			t.Errorf("the forgotten key's history lacks %q:\n%s", want, history)
		}
	}
	shoot("console-history.png")
	audit, _, err := st.AuditLog(ctx, store.AuditFilter{Tenant: "acme", Method: "/payments.v1.PaymentService/CreatePayment", Key: "order-1002"})
	if err != nil || len(audit) != 1 || audit[0].Action != store.ActionForget || audit[0].Operator != "operator-token" ||
		!strings.HasPrefix(audit[0].Reason, "INC-4711") {
		t.Errorf("the store's audit trail of order-1002: %+v, %v", audit, err)
	}
	if os.Getenv(screenshotsEnv) != "" {
		// The abandoned payout's page, for the docs.
		if err := chromedp.Do(tab,
			chromedp.Navigate(base+adminlisten.ConsolePath+"key?tenant=acme&method="+url.QueryEscape(payout)+"&key=payout-8"),
			chromedp.WaitVisible(chromedp.Search(`//h1[text()="Key payout-8"]`))); err != nil {
			t.Fatal(err)
		}
		shoot("console-abandoned.png")
	}
}
