package idemgateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor/idemgateway"
	"github.com/idemkit/idem/transport"
)

// openAPIDocuments are OpenAPI v2 documents that protoc-gen-idem-openapiv2
// writes: the payments example's, which the repository's buf.gen.yaml
// generates, and the plugin's golden test output, which has a leased
// method.
var openAPIDocuments = []string{
	"../../examples/gen/payments/v1/payments.swagger.json",
	"../../cmd/protoc-gen-idem-openapiv2/testdata/cases.swagger.json",
}

// refusals are idem's errors, by reason, as the server sends them
// (status.go and finisher.go of package idem): a keyed operation may get
// any of them, those of leased calls too, since a server can lease any
// method (idem.WithMethodPolicy).
var refusals = map[string]error{
	idem.ReasonKeyMissing:        statusErr(codes.InvalidArgument, idemInfo(idem.ReasonKeyMissing), keyViolation("missing")),
	idem.ReasonKeyInvalid:        statusErr(codes.InvalidArgument, idemInfo(idem.ReasonKeyInvalid), keyViolation("must not be empty")),
	idem.ReasonKeyInUse:          statusErr(codes.Aborted, retryInfo(1500*time.Millisecond), idemInfo(idem.ReasonKeyInUse)),
	idem.ReasonKeyReused:         statusErr(codes.FailedPrecondition, idemInfo(idem.ReasonKeyReused)),
	idem.ReasonLeaseLost:         statusErr(codes.Aborted, retryInfo(time.Second), idemInfo(idem.ReasonLeaseLost)),
	idem.ReasonScopeInvalid:      statusErr(codes.InvalidArgument, idemInfo(idem.ReasonScopeInvalid)),
	idem.ReasonResponseNotCached: statusErr(codes.FailedPrecondition, idemInfo(idem.ReasonResponseNotCached)),
	idem.ReasonStepsUnreadable:   statusErr(codes.DataLoss, idemInfo(idem.ReasonStepsUnreadable)),
	idem.ReasonNotFinished:       statusErr(codes.FailedPrecondition, idemInfo(idem.ReasonNotFinished)),
}

// replayedReasons are the refusals that are recorded, and so replayed to
// retries with idem's headers.
var replayedReasons = []string{idem.ReasonNotFinished}

// replayContext returns a context with the response metadata of a replay,
// which the ServeMux sends as idem's headers.
func replayContext() context.Context {
	return runtime.NewServerMetadataContext(context.Background(), runtime.ServerMetadata{
		HeaderMD: metadata.Pairs(idem.ReplayedHeader, "true", idem.ExpiresHeader, "2026-12-01T20:15:04Z"),
	})
}

// TestOpenAPI: every answer the ServeMux can give to an operation of the
// OpenAPI documents of protoc-gen-idem-openapiv2 is one the document
// describes, status, headers, media type and body: a success; the
// service's own error of each code, recorded and replayed on a keyed
// operation; a malformed Idempotency-Key, which every operation refuses;
// and on a keyed operation each of idem's refusals, with the key rules its
// header parameter gives. A change on either side that the other does not
// follow fails here.
func TestOpenAPI(t *testing.T) {
	mux := runtime.NewServeMux(idemgateway.ServeMuxOptions()...)
	for _, name := range openAPIDocuments {
		t.Run(name, func(t *testing.T) {
			doc := readOpenAPI(t, name)
			n := 0
			for path, item := range doc.Paths {
				for verb, op := range item {
					param := op.keyParameter()
					if param != nil {
						n++
					}
					t.Run(verb+" "+path, func(t *testing.T) {
						checkMalformedKey(t, doc, verb, path, op)
						checkServiceAnswers(t, mux, doc, op, param != nil)
						if param == nil {
							return
						}
						checkKeyRules(t, param.Description)
						checkRefusals(t, mux, doc, op)
					})
				}
			}
			if n == 0 {
				t.Fatalf("no operation has an %s header parameter; regenerate %s", idem.HTTPKeyHeader, name)
			}
		})
	}
}

// checkKeyRules checks the key rules that description gives against
// transport.ValidateKey, at their bounds.
func checkKeyRules(t *testing.T, description string) {
	m := regexp.MustCompile(`(\d+) to (\d+) characters of visible ASCII \(0x([0-9A-F]{2}) to 0x([0-9A-F]{2})\)`).FindStringSubmatch(description)
	if m == nil {
		t.Fatalf("the %s description gives no length and characters: %q", idem.HTTPKeyHeader, description)
	}
	minLen, _ := strconv.Atoi(m[1])
	maxLen, _ := strconv.Atoi(m[2])
	lo, _ := strconv.ParseUint(m[3], 16, 8)
	hi, _ := strconv.ParseUint(m[4], 16, 8)
	for _, c := range []struct {
		key   string
		valid bool
	}{
		{strings.Repeat("a", minLen), true},
		{strings.Repeat("a", minLen-1), false},
		{strings.Repeat("a", maxLen), true},
		{strings.Repeat("a", maxLen+1), false},
		{string(rune(lo)), true},
		{string(rune(hi)), true},
		{string(rune(lo - 1)), false},
		{string(rune(hi + 1)), false},
	} {
		if err := transport.ValidateKey(c.key); (err == nil) != c.valid {
			t.Errorf("the description says %q; ValidateKey(%q) = %v", m[0], c.key, err)
		}
	}
}

// checkRefusals checks that op, a keyed operation, describes each of
// idem's refusals as the ServeMux answers it, and that each of its
// responses that names idem's reasons has their status.
func checkRefusals(t *testing.T, mux *runtime.ServeMux, doc *openAPI, op openAPIOperation) {
	for _, reason := range slices.Sorted(maps.Keys(refusals)) {
		ctx := context.Background()
		if slices.Contains(replayedReasons, reason) {
			ctx = replayContext()
		}
		w := httptest.NewRecorder()
		runtime.HTTPError(ctx, mux, &runtime.JSONPb{}, w, httptest.NewRequest(http.MethodPost, "/", nil), refusals[reason])
		checkAnswer(t, doc, op, reason, w)
		var body map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body["reason"] != reason {
			t.Errorf("%s is sent as %s (%v); want the reason %s", reason, w.Body, err, reason)
		}
		code := strconv.Itoa(w.Code)
		if _, ok := op.Responses[code]; !ok {
			code = "default"
		}
		for c, resp := range op.Responses {
			if c != code && strings.Contains(resp.Description, reason) {
				t.Errorf("response %s names %s, which is answered with %d", c, reason, w.Code)
			}
		}
	}
	reasonRE := regexp.MustCompile(`IDEMPOTENCY_[A-Z_]+`)
	var named []string
	for code, resp := range op.Responses {
		for _, reason := range reasonRE.FindAllString(resp.Description, -1) {
			named = append(named, reason)
			if _, ok := refusals[reason]; !ok {
				t.Errorf("response %s names %s, which the test does not know: add it to refusals", code, reason)
			}
		}
	}
	for _, reason := range []string{idem.ReasonKeyInvalid, idem.ReasonKeyInUse, idem.ReasonKeyReused} {
		if !slices.Contains(named, reason) {
			t.Errorf("no response names %s", reason)
		}
	}
}

// checkMalformedKey checks that op describes the ServeMux's answer to a
// request with a malformed Idempotency-Key, which it refuses on every
// route, keyed or not, before the service is called.
func checkMalformedKey(t *testing.T, doc *openAPI, verb, path string, op openAPIOperation) {
	mux := runtime.NewServeMux(idemgateway.ServeMuxOptions()...)
	called := false
	err := mux.HandlePath(strings.ToUpper(verb), path, func(w http.ResponseWriter, _ *http.Request, _ map[string]string) {
		called = true
		w.WriteHeader(http.StatusOK)
	})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(strings.ToUpper(verb), regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(path, "p1"), nil)
	req.Header.Set(idem.HTTPKeyHeader, `"a b"`)
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, req)
	if called || w.Code != http.StatusBadRequest {
		t.Fatalf("a malformed key: %d %s, the route's handler called: %v; want 400 before the call", w.Code, w.Body, called)
	}
	checkAnswer(t, doc, op, "a malformed key", w)
}

// checkServiceAnswers checks that op describes the ServeMux's success
// answer and each error of the service's own, one for each gRPC code;
// keyed, they come with idem's headers, as a replay does.
func checkServiceAnswers(t *testing.T, mux *runtime.ServeMux, doc *openAPI, op openAPIOperation, keyed bool) {
	ctx := context.Background()
	if keyed {
		ctx = replayContext()
	}
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	w := httptest.NewRecorder()
	runtime.ForwardResponseMessage(ctx, mux, &runtime.JSONPb{}, w, req, &emptypb.Empty{})
	checkAnswer(t, doc, op, "a success", w)
	for c := codes.Canceled; c <= codes.Unauthenticated; c++ {
		w := httptest.NewRecorder()
		runtime.HTTPError(ctx, mux, &runtime.JSONPb{}, w, req, statusErr(c))
		checkAnswer(t, doc, op, "the service's "+c.String(), w)
		// With a RetryInfo, as the service may send, and as idem sends
		// a failure of its store (UNAVAILABLE) or a conflict in it
		// (ABORTED): with Retry-After.
		w = httptest.NewRecorder()
		runtime.HTTPError(ctx, mux, &runtime.JSONPb{}, w, req, statusErr(c, retryInfo(time.Second)))
		if w.Header().Get("Retry-After") != "1" {
			t.Errorf("the service's %s with a RetryInfo of 1s is sent with Retry-After %q, want 1", c, w.Header().Get("Retry-After"))
		}
		checkAnswer(t, doc, op, "the service's "+c.String()+" with a RetryInfo", w)
	}
}

// checkAnswer checks that w, the ServeMux's answer to what, is one op
// describes: a response for its status (or the default), its media type
// among those op produces, each of idem's headers declared, and a body
// that the response's schema admits.
func checkAnswer(t *testing.T, doc *openAPI, op openAPIOperation, what string, w *httptest.ResponseRecorder) {
	t.Helper()
	code := strconv.Itoa(w.Code)
	resp, ok := op.Responses[code]
	if !ok {
		code = "default"
		if resp, ok = op.Responses[code]; !ok {
			t.Errorf("%s is answered with %d, for which the operation has no response", what, w.Code)
			return
		}
	}
	produces := op.Produces
	if produces == nil {
		produces = doc.Produces
	}
	if ct := w.Header().Get("Content-Type"); !slices.Contains(produces, ct) {
		t.Errorf("%s is sent as %s; the operation produces %q", what, ct, produces)
	}
	for _, name := range append(idemHeaders(w.Header()), "Retry-After") {
		v := w.Header().Get(name)
		if v == "" {
			continue
		}
		h, ok := resp.Headers[name]
		if !ok {
			t.Errorf("%s is sent with %s; response %s does not declare it", what, name, code)
		} else if h.Enum != nil && !slices.Contains(h.Enum, v) {
			t.Errorf("%s is sent with %s: %s; response %s declares the values %q", what, name, v, code, h.Enum)
		}
	}
	if resp.Schema == nil {
		t.Errorf("%s is sent with the body %s; response %s declares none", what, w.Body, code)
		return
	}
	dec := json.NewDecoder(bytes.NewReader(w.Body.Bytes()))
	dec.UseNumber()
	var body any
	if err := dec.Decode(&body); err != nil {
		t.Errorf("%s: body %s: %v", what, w.Body, err)
		return
	}
	for _, e := range doc.refuses(t, *resp.Schema, body, "") {
		t.Errorf("%s: response %s's schema does not admit the body: %s", what, code, e)
	}
}

// openAPI is what the test reads of an OpenAPI v2 document.
type openAPI struct {
	Produces    []string                               `json:"produces"`
	Paths       map[string]map[string]openAPIOperation `json:"paths"`
	Definitions map[string]openAPISchema               `json:"definitions"`
}

type openAPIOperation struct {
	Parameters []openAPIParameter         `json:"parameters"`
	Produces   []string                   `json:"produces"`
	Responses  map[string]openAPIResponse `json:"responses"`
}

type openAPIParameter struct {
	Name        string `json:"name"`
	In          string `json:"in"`
	Description string `json:"description"`
}

type openAPIResponse struct {
	Description string         `json:"description"`
	Schema      *openAPISchema `json:"schema"`
	Headers     map[string]struct {
		Enum []string `json:"enum"`
	} `json:"headers"`
}

type openAPISchema struct {
	Ref                  string                   `json:"$ref"`
	Type                 string                   `json:"type"`
	Properties           map[string]openAPISchema `json:"properties"`
	AdditionalProperties any                      `json:"additionalProperties"`
	Items                *openAPISchema           `json:"items"`
	Required             []string                 `json:"required"`
}

func readOpenAPI(t *testing.T, name string) *openAPI {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPI
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return &doc
}

// keyParameter returns op's Idempotency-Key header parameter, or nil.
func (op openAPIOperation) keyParameter() *openAPIParameter {
	for i, p := range op.Parameters {
		if p.In == "header" && p.Name == idem.HTTPKeyHeader {
			return &op.Parameters[i]
		}
	}
	return nil
}

// refuses returns what of v, a JSON value decoded with UseNumber at
// the path at, the schema s does not admit as a client generated from the
// document reads it: a value of another type, a member s does not declare
// (which the client cannot read), a required member missing.
func (doc *openAPI) refuses(t *testing.T, s openAPISchema, v any, at string) []string {
	t.Helper()
	if s.Ref != "" {
		d, ok := doc.Definitions[strings.TrimPrefix(s.Ref, "#/definitions/")]
		if !ok || !strings.HasPrefix(s.Ref, "#/definitions/") {
			t.Fatalf("schema %q names no definition", s.Ref)
		}
		s = d
	}
	var types []string // the types of v that s may declare
	var errs []string
	switch v := v.(type) {
	case map[string]any:
		types = []string{"object"}
		for _, name := range slices.Sorted(maps.Keys(v)) {
			p, ok := s.Properties[name]
			switch {
			case ok:
				errs = append(errs, doc.refuses(t, p, v[name], at+name+".")...)
			case s.AdditionalProperties == nil || s.AdditionalProperties == false:
				errs = append(errs, at+name+" is not declared")
			}
		}
		for _, name := range s.Required {
			if _, ok := v[name]; !ok {
				errs = append(errs, at+name+" is required")
			}
		}
	case []any:
		types = []string{"array"}
		for i, e := range v {
			if s.Items != nil {
				errs = append(errs, doc.refuses(t, *s.Items, e, at+strconv.Itoa(i)+".")...)
			}
		}
	case json.Number:
		types = []string{"number"}
		if _, err := v.Int64(); err == nil {
			types = append(types, "integer")
		}
	case string:
		types = []string{"string"}
	case bool:
		types = []string{"boolean"}
	}
	if s.Type != "" && !slices.Contains(types, s.Type) {
		name := strings.TrimSuffix(at, ".")
		if name == "" {
			name = "the body"
		}
		errs = append(errs, fmt.Sprintf("%s is %v, not of type %s", name, v, s.Type))
	}
	return errs
}
