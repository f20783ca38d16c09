package admin

import (
	"bytes"
	"context"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
	"github.com/idemkit/idem/internal/adminwire"
	"github.com/idemkit/idem/store"
)

// consoleFiles are the console's templates and style sheet.
//
//go:embed console
var consoleFiles embed.FS

// consolePages are the console's pages, each the layout with its content.
var consolePages = func() map[string]*template.Template {
	layout := template.Must(template.New("layout.html").Funcs(consoleFuncs).ParseFS(consoleFiles, "console/layout.html"))
	pages := map[string]*template.Template{}
	for _, name := range []string{"keys", "key", "confirm", "error"} {
		pages[name] = template.Must(template.Must(layout.Clone()).ParseFS(consoleFiles, "console/"+name+".html"))
	}
	return pages
}()

var consoleStyle = func() []byte {
	b, err := consoleFiles.ReadFile("console/style.css")
	if err != nil {
		panic(err)
	}
	return b
}()

// consolePageSize is the number of keys a page of the console lists.
const consolePageSize = 50

// historySize is the number of audit entries a key's page shows.
const historySize = 100

// NewConsole returns the console of srv: web pages an operator's browser
// shows, server-rendered, that list the keys of srv's store, show one key,
// and forget, settle and finish keys, each action behind a confirmation
// page that asks for a reason. Each page calls srv's methods, as a wire
// does, so each is authorized by srv's [Authorizer] with the browser's
// request headers, TLS state and address in its [Request], as Connect's
// are, and an action's reason goes to the audit trail: see the package
// documentation's "Console" section.
//
// Its links are relative: mount it at a path of its own with
// [http.StripPrefix], on the operators' listener, not the public one:
//
//	mux.Handle("/console/", http.StripPrefix("/console", admin.NewConsole(srv)))
func NewConsole(srv *Server) http.Handler {
	if srv == nil {
		panic("admin: NewConsole needs a Server")
	}
	return &console{srv: srv, csrf: http.NewCrossOriginProtection()}
}

// console is the handler NewConsole returns.
type console struct {
	srv  *Server
	csrf *http.CrossOriginProtection
}

// An action is one of the console's actions on a key.
type action struct {
	Name  string // the path of its confirmation page and form
	RPC   string // the RPC that takes it
	Verb  string // its button's text
	Past  string // what was done, for the notice after it
	Title string // its confirmation page's title
}

var actions = map[string]action{
	"forget": {Name: "forget", RPC: forgetKey, Verb: "Forget", Past: "Forgot", Title: "Forget a key"},
	"settle": {Name: "settle", RPC: settleKey, Verb: "Settle", Past: "Settled", Title: "Settle a key"},
	"finish": {Name: "finish", RPC: finishKey, Verb: "Finish", Past: "Finished", Title: "Finish a call"},
}

func (c *console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	// Mounted with http.StripPrefix("/console", ...) or ("/console/", ...):
	// the page's path with or without its leading slash.
	p := strings.TrimPrefix(r.URL.Path, "/")
	safe := r.Method == http.MethodGet || r.Method == http.MethodHead
	switch a, isAction := actions[p]; {
	case p == "style.css" && safe:
		h.Set("Content-Type", "text/css; charset=utf-8")
		h.Set("Cache-Control", "max-age=3600")
		w.Write(consoleStyle)
	case p == "" && safe:
		c.list(w, r)
	case p == "key" && safe:
		c.key(w, r)
	case isAction && safe:
		c.confirm(w, r, a)
	case isAction && r.Method == http.MethodPost:
		c.act(w, r, a)
	case p == "" || p == "key" || p == "style.css" || isAction:
		allow := "GET, HEAD"
		if isAction {
			allow += ", POST"
		}
		h.Set("Allow", allow)
		c.fail(w, r, http.StatusMethodNotAllowed, "method "+r.Method+" is not allowed here")
	default:
		c.fail(w, r, http.StatusNotFound, "no such page")
	}
}

// context returns the context of a call the console makes for r: r's, with
// its caller as the Authorizer sees it, mapped as idemconnect maps a
// Connect request's.
func (c *console) context(r *http.Request) context.Context {
	return adminwire.NewContext(r.Context(), adminwire.HTTPCaller(r))
}

// page is what every page shows around its content.
type page struct {
	Title      string
	Status     int
	Error      string // the answer of a call that failed, shown above the content
	Notice     string // what the last action did
	NoticeLink string // the page of the key it did it to
}

func (c *console) render(w http.ResponseWriter, r *http.Request, name string, status int, data any) {
	var buf bytes.Buffer
	if err := consolePages[name].Execute(&buf, data); err != nil {
		c.srv.log().LogAttrs(r.Context(), slog.LevelError, "idem admin console: a page failed to render",
			slog.String("page", name), slog.String("error", err.Error()))
		http.Error(w, "the page failed to render; the server's log has the detail", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		w.Write(buf.Bytes())
	}
}

// errorPage is the page of a request that failed.
type errorPage struct {
	page
	Back string // a link back, if any
}

func (c *console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, r, "error", status, errorPage{page: page{Title: http.StatusText(status), Status: status, Error: msg}})
}

// answer returns the HTTP status and the message of err, a Server's
// answer: the message its status carries, which holds no store's text.
func (c *console) answer(r *http.Request, err error) (int, string) {
	st, ok := adminwire.Status(err)
	if !ok {
		c.srv.log().LogAttrs(r.Context(), slog.LevelError, "idem admin console: a call failed with an error that carries no status",
			slog.String("error", err.Error()))
		return http.StatusInternalServerError, "the call failed; the server's log has the detail"
	}
	return httpStatus(code.Code(st.GetCode())), code.Code(st.GetCode()).String() + ": " + st.GetMessage()
}

// httpStatus returns the HTTP status of a call's answer with code cd.
func httpStatus(cd code.Code) int {
	switch cd {
	case code.Code_OK:
		return http.StatusOK
	case code.Code_INVALID_ARGUMENT, code.Code_OUT_OF_RANGE:
		return http.StatusBadRequest
	case code.Code_UNAUTHENTICATED:
		return http.StatusUnauthorized
	case code.Code_PERMISSION_DENIED:
		return http.StatusForbidden
	case code.Code_NOT_FOUND:
		return http.StatusNotFound
	case code.Code_FAILED_PRECONDITION, code.Code_ABORTED, code.Code_ALREADY_EXISTS:
		return http.StatusConflict
	case code.Code_RESOURCE_EXHAUSTED:
		return http.StatusTooManyRequests
	case code.Code_UNIMPLEMENTED:
		return http.StatusNotImplemented
	case code.Code_UNAVAILABLE:
		return http.StatusServiceUnavailable
	case code.Code_DEADLINE_EXCEEDED:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// keysPage is the list of keys.
type keysPage struct {
	page
	F     filterForm
	Keys  []keyRow
	Next  string // the next page's link, if any
	First string // the first page's link, when this page is not the first
	Stats *statsView
}

// statsView is the counts of the keys the filter selects, by tenant,
// method and state: GetKeyStats's answer.
type statsView struct {
	Error            string // GetKeyStats's answer when it failed
	States           []string
	Rows             []statsRow
	Total            statsRow
	All              bool   // every state is counted
	CountAll         string // the link that counts every state, when not All
	OldestInProgress *keyRow
	OldestAbandoned  *keyRow
}

// statsRow is the counts of one tenant and method, a cell per state.
type statsRow struct {
	Tenant, Method string
	Cells          []statsCell
	Total          int64
}

type statsCell struct {
	Count int64
	Link  string // the list of those keys
}

// filterForm is the list's filter, as its form shows it.
type filterForm struct {
	AllTenants bool
	Tenant     string
	Method     string
	States     map[string]bool
	Older      string // a duration: created before now minus it
	Newer      string // a duration: created after now minus it
	Before     string // RFC 3339: the bound Older set, kept by the page links
	After      string
}

// keyRow is one key of the list.
type keyRow struct {
	Key     *adminv1.Key
	Link    string
	State   string
	Created timeView
	Updated timeView
	Lease   timeView
}

// states are the states the list filters on, by their form value.
var states = []struct {
	Value string
	Label string
	State adminv1.KeyState
}{
	{"in_progress", "in progress", adminv1.KeyState_KEY_STATE_IN_PROGRESS},
	{"abandoned", "abandoned", adminv1.KeyState_KEY_STATE_ABANDONED},
	{"recorded", "recorded", adminv1.KeyState_KEY_STATE_RECORDED},
	{"expired", "expired", adminv1.KeyState_KEY_STATE_EXPIRED},
}

// stateValue returns the form value of the state s.
func stateValue(s adminv1.KeyState) string {
	for _, st := range states {
		if st.State == s {
			return st.Value
		}
	}
	return ""
}

func stateLabel(s adminv1.KeyState) string {
	for _, st := range states {
		if st.State == s {
			return st.Label
		}
	}
	return "unknown"
}

func (c *console) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	now := time.Now()
	data := keysPage{page: page{Title: "Keys", Status: http.StatusOK}}
	f := &data.F
	// The form sends f=1, so that an unticked "every tenant" is told from a
	// first visit, which lists every tenant's keys unless it names one.
	f.AllTenants = q.Get("all") != "" || q.Get("f") == "" && !q.Has("tenant")
	f.Tenant, f.Method = q.Get("tenant"), q.Get("method")
	f.States = map[string]bool{}
	req := &adminv1.ListKeysRequest{AllTenants: f.AllTenants, Method: f.Method, PageSize: consolePageSize, PageToken: q.Get("page")}
	if !f.AllTenants {
		req.Tenant = f.Tenant
	}
	for _, v := range q["state"] {
		for _, st := range states {
			if st.Value == v && !f.States[v] {
				f.States[v] = true
				req.States = append(req.States, st.State)
			}
		}
	}
	// A page token is signed with the filter, its times included: an age
	// becomes a time once, which the page links carry.
	var bad []string
	for _, b := range []struct {
		name, age, at string
		view, abs     *string
		to            **timestamppb.Timestamp
	}{
		{"older than", q.Get("older"), q.Get("before"), &f.Older, &f.Before, &req.CreatedBefore},
		{"newer than", q.Get("newer"), q.Get("after"), &f.Newer, &f.After, &req.CreatedAfter},
	} {
		*b.view = b.age
		var t time.Time
		switch {
		case b.at != "":
			var err error
			if t, err = time.Parse(time.RFC3339Nano, b.at); err != nil {
				bad = append(bad, fmt.Sprintf("%s: %q is not an RFC 3339 time", b.name, b.at))
				continue
			}
		case b.age != "":
			d, err := parseAge(b.age)
			if err != nil {
				bad = append(bad, fmt.Sprintf("%s: %v", b.name, err))
				continue
			}
			t = now.Add(-d)
		default:
			continue
		}
		*b.abs = t.UTC().Format(time.RFC3339Nano)
		*b.to = timestamppb.New(t)
	}
	if len(bad) > 0 {
		data.Status, data.Error = http.StatusBadRequest, strings.Join(bad, "; ")
		c.render(w, r, "keys", data.Status, data)
		return
	}
	if d := q.Get("done"); d != "" {
		if a, ok := actions[d]; ok {
			data.Notice = fmt.Sprintf("%s the key %s of %s%s.", a.Past, q.Get("key"), q.Get("keymethod"), tenantSuffix(q.Get("keytenant")))
			data.NoticeLink = keyLink("key", q.Get("keytenant"), q.Get("keymethod"), q.Get("key"), nil)
		}
	}
	resp, err := c.srv.ListKeys(c.context(r), req)
	if err != nil {
		data.Status, data.Error = c.answer(r, err)
		c.render(w, r, "keys", data.Status, data)
		return
	}
	if req.GetPageToken() == "" {
		data.Stats = c.stats(r, req, f, q.Get("counts") == "all", now)
	}
	for _, k := range resp.GetKeys() {
		data.Keys = append(data.Keys, rowOf(k, now))
	}
	if tok := resp.GetNextPageToken(); tok != "" {
		v := f.values()
		v.Set("page", tok)
		data.Next = "./?" + v.Encode()
	}
	if req.GetPageToken() != "" {
		data.First = "./?" + f.values().Encode()
	}
	c.render(w, r, "keys", data.Status, data)
}

// values returns the query of the list of f, its ages as times.
func (f *filterForm) values() url.Values {
	v := url.Values{"f": {"1"}}
	if f.AllTenants {
		v.Set("all", "1")
	} else {
		v.Set("tenant", f.Tenant)
	}
	if f.Method != "" {
		v.Set("method", f.Method)
	}
	for _, st := range states {
		if f.States[st.Value] {
			v.Add("state", st.Value)
		}
	}
	if f.Before != "" {
		v.Set("before", f.Before)
	}
	if f.After != "" {
		v.Set("after", f.After)
	}
	return v
}

// stuckStates are the states the list counts unless its filter names
// states or the operator asks for every state: an index holds the keys in
// progress on their own, so that counting them is cheap on any table,
// while counting the recorded keys reads every key the filter selects.
var stuckStates = []adminv1.KeyState{adminv1.KeyState_KEY_STATE_IN_PROGRESS, adminv1.KeyState_KEY_STATE_ABANDONED}

// stats returns the counts of the keys of the list req, whose form is f:
// of the states f names, else of every state with all, else of the keys in
// progress and abandoned.
func (c *console) stats(r *http.Request, req *adminv1.ListKeysRequest, f *filterForm, all bool, now time.Time) *statsView {
	sreq := &adminv1.GetKeyStatsRequest{Tenant: req.GetTenant(), AllTenants: req.GetAllTenants(), Method: req.GetMethod(),
		States: req.GetStates(), CreatedAfter: req.GetCreatedAfter(), CreatedBefore: req.GetCreatedBefore()}
	v := &statsView{All: all || len(sreq.States) > 0}
	if !v.All {
		sreq.States = stuckStates
		q := f.values()
		q.Set("counts", "all")
		v.CountAll = "./?" + q.Encode()
	}
	resp, err := c.srv.GetKeyStats(c.context(r), sreq)
	if err != nil {
		_, v.Error = c.answer(r, err)
		return v
	}
	var cols []adminv1.KeyState
	for _, st := range states {
		if len(sreq.States) == 0 || slices.Contains(sreq.States, st.State) {
			cols = append(cols, st.State)
			v.States = append(v.States, st.Label)
		}
	}
	// cell adds n keys in state st to row, whose cells link to the list
	// of those keys: query, with the state.
	cell := func(row *statsRow, query url.Values, st adminv1.KeyState, n int64) {
		i := slices.Index(cols, st)
		if i < 0 {
			return
		}
		row.Cells[i].Count += n
		row.Total += n
		query.Set("state", stateValue(st))
		row.Cells[i].Link = "./?" + query.Encode()
	}
	v.Total = statsRow{Cells: make([]statsCell, len(cols))}
	rows := map[[2]string]int{} // v.Rows's index of a tenant and method
	for _, n := range resp.GetCounts() {
		i, ok := rows[[2]string{n.GetTenant(), n.GetMethod()}]
		if !ok {
			i = len(v.Rows)
			rows[[2]string{n.GetTenant(), n.GetMethod()}] = i
			v.Rows = append(v.Rows, statsRow{Tenant: n.GetTenant(), Method: n.GetMethod(), Cells: make([]statsCell, len(cols))})
		}
		one := f.values()
		one.Del("all")
		one.Set("tenant", n.GetTenant())
		one.Set("method", n.GetMethod())
		cell(&v.Rows[i], one, n.GetState(), n.GetCount())
		cell(&v.Total, f.values(), n.GetState(), n.GetCount())
	}
	for _, o := range []struct {
		k  *adminv1.Key
		to **keyRow
	}{{resp.GetOldestInProgress(), &v.OldestInProgress}, {resp.GetOldestAbandoned(), &v.OldestAbandoned}} {
		if o.k != nil {
			row := rowOf(o.k, now)
			*o.to = &row
		}
	}
	return v
}

// rowOf returns k as the list shows it.
func rowOf(k *adminv1.Key, now time.Time) keyRow {
	return keyRow{
		Key:     k,
		Link:    keyLink("key", k.GetTenant(), k.GetMethod(), k.GetKey(), nil),
		State:   stateLabel(k.GetState()),
		Created: viewTime(k.GetCreateTime(), now),
		Updated: viewTime(k.GetUpdateTime(), now),
		Lease:   viewTime(k.GetLeaseExpireTime(), now),
	}
}

// parseAge parses an age: a Go duration (90s, 15m, 2h30m) or a number of
// days (3d).
func parseAge(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		if days, err := strconv.Atoi(n); err == nil && days >= 0 && days < 100000 {
			return time.Duration(days) * 24 * time.Hour, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not an age such as 90s, 15m, 2h or 3d", s)
	}
	return d, nil
}

func tenantSuffix(tenant string) string {
	if tenant == "" {
		return ""
	}
	return " (tenant " + tenant + ")"
}

// keyLink returns the link to page for the key, with extra's values.
func keyLink(page, tenant, method, key string, extra url.Values) string {
	v := url.Values{"tenant": {tenant}, "method": {method}, "key": {key}}
	for name, vs := range extra {
		v[name] = vs
	}
	return page + "?" + v.Encode()
}

// timeView is a time as a page shows it.
type timeView struct {
	Set bool
	UTC string // 2026-01-02 03:04:05 UTC
	Age string // 5m ago, in 2m
}

func viewTime(ts *timestamppb.Timestamp, now time.Time) timeView {
	if ts == nil {
		return timeView{}
	}
	t := ts.AsTime()
	v := timeView{Set: true, UTC: t.UTC().Format("2006-01-02 15:04:05 MST")}
	d := now.Sub(t)
	switch {
	case d >= 0:
		v.Age = roughly(d) + " ago"
	default:
		v.Age = "in " + roughly(-d)
	}
	return v
}

// roughly returns d in its largest unit.
func roughly(d time.Duration) string {
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + "d"
}

// keyPage is one key's page.
type keyPage struct {
	page
	Key     *keyView // nil when the key cannot be read
	Actions []actionLink
	History historyView
}

// historyView is a key's audit trail, ListAudit's answer.
type historyView struct {
	Error   string // ListAudit's answer when it failed
	Entries []auditRow
	More    bool // the key has more entries than the page shows
}

type auditRow struct {
	E      *adminv1.AuditEntry
	Time   timeView
	Action string
	Before string
	After  string
}

// keyView is a key as its page shows it.
type keyView struct {
	K           *adminv1.Key
	State       string
	Fingerprint string
	Created     timeView
	Updated     timeView
	Expires     timeView
	Lease       timeView
	LeaseLive   bool
	LastReplay  timeView
	Steps       []stepView
	Request     *requestView
	Outcome     *outcomeView
}

// requestView is the request a key keeps (adminv1.Request).
type requestView struct {
	Type    string
	JSON    string // decoded, as protobuf's JSON mapping
	Raw     string // as kept, base64, when it could not be decoded
	RawSize int
	Note    string
}

type stepView struct {
	Name   string
	Result string
	Binary bool
	Size   int
}

type outcomeView struct {
	Code         string
	ResponseType string
	Response     string // the response as protobuf's JSON mapping
	Raw          string // the raw response, base64
	RawSize      int
	Error        *spb.Status
	ErrorCode    string
	ErrorDetails string // the error's details as JSON
	NotCached    bool
	Note         string
}

type actionLink struct {
	Verb string
	Link string
}

func viewKey(k *adminv1.Key, now time.Time) keyView {
	v := keyView{
		K:           k,
		State:       stateLabel(k.GetState()),
		Fingerprint: hex.EncodeToString(k.GetFingerprint()),
		Created:     viewTime(k.GetCreateTime(), now),
		Updated:     viewTime(k.GetUpdateTime(), now),
		Expires:     viewTime(k.GetExpireTime(), now),
		Lease:       viewTime(k.GetLeaseExpireTime(), now),
		LeaseLive:   k.GetLeaseExpireTime() != nil && k.GetLeaseExpireTime().AsTime().After(now),
		LastReplay:  viewTime(k.GetLastReplayTime(), now),
	}
	if r := k.GetRequest(); r != nil {
		v.Request = &requestView{Type: r.GetRequestType(), Note: r.GetNote()}
		if d := r.GetDecoded(); d != nil {
			v.Request.JSON = indentJSON(d)
		}
		if raw := r.GetRaw(); raw != nil {
			v.Request.Raw, v.Request.RawSize = base64.StdEncoding.EncodeToString(raw), len(raw)
		}
	}
	for _, s := range k.GetSteps() {
		sv := stepView{Name: s.GetName(), Size: len(s.GetResult())}
		if utf8.Valid(s.GetResult()) {
			sv.Result = string(s.GetResult())
		} else {
			sv.Result, sv.Binary = base64.StdEncoding.EncodeToString(s.GetResult()), true
		}
		v.Steps = append(v.Steps, sv)
	}
	if o := k.GetOutcome(); o != nil {
		ov := &outcomeView{
			Code:         code.Code(o.GetCode()).String(),
			ResponseType: o.GetResponseType(),
			NotCached:    o.GetNotCached(),
			Note:         o.GetNote(),
		}
		switch res := o.GetResult().(type) {
		case *adminv1.Outcome_Response:
			ov.Response = indentJSON(res.Response)
		case *adminv1.Outcome_RawResponse:
			ov.Raw, ov.RawSize = base64.StdEncoding.EncodeToString(res.RawResponse), len(res.RawResponse)
		case *adminv1.Outcome_Error:
			ov.Error = res.Error
			ov.ErrorCode = code.Code(res.Error.GetCode()).String()
			if len(res.Error.GetDetails()) > 0 {
				ov.ErrorDetails = indentJSON(&spb.Status{Details: res.Error.GetDetails()})
			}
		}
		v.Outcome = ov
	}
	return v
}

// indentJSON returns m in protobuf's JSON mapping, indented by two spaces
// the same way every time (protojson varies its spaces on purpose).
func indentJSON(m proto.Message) string {
	b, err := protojson.Marshal(m)
	if err != nil {
		return fmt.Sprintf("(the server cannot render it as JSON: %v)", err)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, b, "", "  "); err != nil {
		return string(b)
	}
	return buf.String()
}

// keyOf returns the key a page's query or form names.
func keyOf(v url.Values) (tenant, method, key string) {
	return v.Get("tenant"), v.Get("method"), v.Get("key")
}

func (c *console) key(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	tenant, method, key := keyOf(q)
	ctx, now := c.context(r), time.Now()
	resp, err := c.srv.GetKey(ctx, &adminv1.GetKeyRequest{Tenant: tenant, Method: method, Key: key})
	if err != nil {
		status, msg := c.answer(r, err)
		if status != http.StatusNotFound {
			c.render(w, r, "error", status, errorPage{page: page{Title: "Key", Status: status, Error: msg}, Back: "./"})
			return
		}
		// A key the store no longer holds (forgotten, say) still has its
		// history.
		c.render(w, r, "key", status, keyPage{page: page{Title: "Key " + key, Status: status, Error: msg}, History: c.history(r, tenant, method, key, now)})
		return
	}
	k := resp.GetKey()
	kv := viewKey(k, now)
	data := keyPage{page: page{Title: "Key " + k.GetKey(), Status: http.StatusOK}, Key: &kv, History: c.history(r, tenant, method, key, now)}
	if a, ok := actions[q.Get("done")]; ok {
		data.Notice = a.Past + " the key."
	}
	inProgress := k.GetState() == adminv1.KeyState_KEY_STATE_IN_PROGRESS || k.GetState() == adminv1.KeyState_KEY_STATE_ABANDONED
	for _, a := range []struct {
		name string
		show bool
	}{
		{"finish", k.GetState() == adminv1.KeyState_KEY_STATE_ABANDONED && k.GetFinishable()},
		{"settle", inProgress},
		{"forget", true},
	} {
		// Only the actions the operator may take: none for a read-only
		// grant.
		if a.show && c.srv.allowed(ctx, actionRequest(actions[a.name], tenant, method, key)) {
			data.Actions = append(data.Actions, actionLink{Verb: actions[a.name].Verb + "…", Link: keyLink(a.name, tenant, method, key, nil)})
		}
	}
	c.render(w, r, "key", http.StatusOK, data)
}

// actionRequest returns the Request of the action a on the key, as the
// Authorizer sees it.
func actionRequest(a action, tenant, method, key string) Request {
	return keyRequest(a.RPC, tenant, method, key, false, "")
}

// history returns the key's audit trail, its first historySize entries.
func (c *console) history(r *http.Request, tenant, method, key string, now time.Time) historyView {
	resp, err := c.srv.ListAudit(c.context(r), &adminv1.ListAuditRequest{Tenant: tenant, Method: method, Key: key, PageSize: historySize})
	if err != nil {
		_, msg := c.answer(r, err)
		return historyView{Error: msg}
	}
	h := historyView{More: resp.GetNextPageToken() != ""}
	for _, e := range resp.GetEntries() {
		row := auditRow{E: e, Time: viewTime(e.GetTime(), now), Action: strings.ToLower(strings.TrimPrefix(e.GetAction().String(), "AUDIT_ACTION_")),
			Before: stateLabel(e.GetStateBefore()), After: stateLabel(e.GetStateAfter())}
		if e.GetStateAfter() == adminv1.KeyState_KEY_STATE_UNSPECIFIED {
			row.After = "forgotten"
		}
		h.Entries = append(h.Entries, row)
	}
	return h
}

// confirmPage is an action's confirmation page, its form.
type confirmPage struct {
	page
	Action  action
	Key     keyView
	KeyLink string
	Form    actionForm
	Codes   []string // the codes a key may be settled with
	Max     int      // the longest reason, in bytes
	Refused bool     // the operator may not take the action: no form
}

// actionForm is what an action's form sends.
type actionForm struct {
	Tenant, Method, Key string
	Reason              string
	Force               bool
	Code                string // settle's
	Message             string // settle's
}

func formOf(v url.Values) actionForm {
	f := actionForm{Reason: strings.TrimSpace(v.Get("reason")), Force: v.Get("force") != "", Code: v.Get("code"), Message: v.Get("message")}
	f.Tenant, f.Method, f.Key = keyOf(v)
	if f.Code == "" {
		f.Code = code.Code_FAILED_PRECONDITION.String()
	}
	if _, ok := v["message"]; !ok {
		f.Message = "settled by an operator"
	}
	return f
}

// settleCodes are the codes a key may be settled with: those
// store.SettleOutcome takes.
var settleCodes = func() []string {
	var cs []string
	for c := code.Code_CANCELLED; c <= code.Code_UNAUTHENTICATED; c++ {
		if _, err := store.SettleOutcome(&spb.Status{Code: int32(c)}); err == nil {
			cs = append(cs, c.String())
		}
	}
	return cs
}()

func (c *console) confirm(w http.ResponseWriter, r *http.Request, a action) {
	form := formOf(r.URL.Query())
	if !c.srv.allowed(c.context(r), actionRequest(a, form.Tenant, form.Method, form.Key)) {
		c.confirmWith(w, r, a, form, http.StatusForbidden, "you may not "+strings.ToLower(a.Verb)+" this key: the service's authorizer does not allow it (a read-only grant, say)")
		return
	}
	c.confirmWith(w, r, a, form, http.StatusOK, "")
}

// confirmWith renders a's confirmation page with form, and the error msg
// of a previous attempt, if any, with status.
func (c *console) confirmWith(w http.ResponseWriter, r *http.Request, a action, form actionForm, status int, msg string) {
	resp, err := c.srv.GetKey(c.context(r), &adminv1.GetKeyRequest{Tenant: form.Tenant, Method: form.Method, Key: form.Key})
	if err != nil {
		st, m := c.answer(r, err)
		if msg != "" {
			st, m = status, msg+" (and the key cannot be read: "+m+")"
		}
		c.render(w, r, "error", st, errorPage{page: page{Title: a.Title, Status: st, Error: m}, Back: "./"})
		return
	}
	data := confirmPage{
		page:    page{Title: a.Title, Status: status, Error: msg},
		Action:  a,
		Key:     viewKey(resp.GetKey(), time.Now()),
		KeyLink: keyLink("key", form.Tenant, form.Method, form.Key, nil),
		Form:    form,
		Codes:   settleCodes,
		Max:     store.MaxReasonLength,
		Refused: status == http.StatusForbidden,
	}
	c.render(w, r, "confirm", status, data)
}

func (c *console) act(w http.ResponseWriter, r *http.Request, a action) {
	// Refuse a cross-origin form (CSRF) before reading it.
	if err := c.csrf.Check(r); err != nil {
		c.fail(w, r, http.StatusForbidden, "cross-origin request refused: the console's actions are taken from its own pages")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, "the form cannot be read")
		return
	}
	form := formOf(r.PostForm)
	if form.Reason == "" {
		// The service takes an unforced action without a reason; the
		// console asks for one every time.
		c.confirmWith(w, r, a, form, http.StatusBadRequest, "a reason is required: say why you "+strings.ToLower(a.Verb)+" the key, for the audit trail")
		return
	}
	if err := c.do(c.context(r), a, form); err != nil {
		status, msg := c.answer(r, err)
		c.confirmWith(w, r, a, form, status, msg)
		return
	}
	// The page the action leads to, by a link relative to the form's,
	// which the browser resolves (http.Redirect would resolve it against
	// the path with the console's prefix stripped).
	next := keyLink("key", form.Tenant, form.Method, form.Key, url.Values{"done": {a.Name}})
	if a.Name == "forget" {
		next = "./?" + url.Values{"done": {a.Name}, "keytenant": {form.Tenant}, "keymethod": {form.Method}, "key": {form.Key}}.Encode()
	}
	w.Header().Set("Location", next)
	w.WriteHeader(http.StatusSeeOther)
}

// do takes the action a the form asks for through the Server's RPC, with
// the operator's reason, which the audit trail keeps, and returns its
// answer.
func (c *console) do(ctx context.Context, a action, f actionForm) error {
	var err error
	switch a.Name {
	case "forget":
		_, err = c.srv.ForgetKey(ctx, &adminv1.ForgetKeyRequest{Tenant: f.Tenant, Method: f.Method, Key: f.Key, Force: f.Force, Reason: f.Reason})
	case "settle":
		cd, ok := code.Code_value[f.Code]
		if !ok {
			return invalid("%q is not a gRPC code", f.Code)
		}
		_, err = c.srv.SettleKey(ctx, &adminv1.SettleKeyRequest{Tenant: f.Tenant, Method: f.Method, Key: f.Key, Force: f.Force,
			Status: &spb.Status{Code: cd, Message: f.Message}, Reason: f.Reason})
	case "finish":
		_, err = c.srv.FinishKey(ctx, &adminv1.FinishKeyRequest{Tenant: f.Tenant, Method: f.Method, Key: f.Key, Reason: f.Reason})
	default:
		err = errors.New("unknown action " + a.Name)
	}
	return err
}

// consoleFuncs are the functions the console's templates call.
var consoleFuncs = template.FuncMap{
	"tenantOf": tenantSuffix,
	"states":   func() any { return states },
	"stateClass": func(s adminv1.KeyState) string {
		return strings.ReplaceAll(stateLabel(s), " ", "-")
	},
}
