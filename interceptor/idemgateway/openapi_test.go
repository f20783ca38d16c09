package idemgateway_test

import (
	"context"
	"encoding/json"
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

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor/idemgateway"
)

// openAPIDocuments are OpenAPI v2 documents that protoc-gen-idem-openapiv2
// writes: the payments example's, which the repository's buf.gen.yaml
// generates, and the plugin's golden test output, which has a leased
// method.
var openAPIDocuments = []string{
	"../../examples/gen/payments/v1/payments.swagger.json",
	"../../cmd/protoc-gen-idem-openapiv2/testdata/cases.swagger.json",
}

// refusals are idem's errors that the OpenAPI documents name by reason, as
// the server sends them (status.go of package idem).
var refusals = map[string]error{
	idem.ReasonKeyMissing: statusErr(codes.InvalidArgument, idemInfo(idem.ReasonKeyMissing), keyViolation("missing")),
	idem.ReasonKeyInvalid: statusErr(codes.InvalidArgument, idemInfo(idem.ReasonKeyInvalid), keyViolation("must not be empty")),
	idem.ReasonKeyInUse:   statusErr(codes.Aborted, retryInfo(1500*time.Millisecond), idemInfo(idem.ReasonKeyInUse)),
	idem.ReasonKeyReused:  statusErr(codes.FailedPrecondition, idemInfo(idem.ReasonKeyReused)),
	idem.ReasonLeaseLost:  statusErr(codes.Aborted, retryInfo(time.Second), idemInfo(idem.ReasonLeaseLost)),
}

// TestOpenAPI: what the OpenAPI documents of protoc-gen-idem-openapiv2 say
// of idem's keyed operations is what this package sends. The header's
// name and key rules, each refusal's status, headers, media type and
// problem details fields, and the headers of the answers: a change on
// either side that the other does not follow fails here.
func TestOpenAPI(t *testing.T) {
	mux := runtime.NewServeMux(idemgateway.ServeMuxOptions()...)
	for _, name := range openAPIDocuments {
		t.Run(name, func(t *testing.T) {
			doc := readOpenAPI(t, name)
			n := 0
			for path, item := range doc.Paths {
				for verb, op := range item {
					param := op.keyParameter()
					if param == nil {
						continue
					}
					n++
					t.Run(verb+" "+path, func(t *testing.T) {
						checkKeyRules(t, param.Description)
						checkRefusals(t, mux, doc, op)
						checkAnswerHeaders(t, op)
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
// idem.ValidateKey, at their bounds.
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
		if err := idem.ValidateKey(c.key); (err == nil) != c.valid {
			t.Errorf("the description says %q; ValidateKey(%q) = %v", m[0], c.key, err)
		}
	}
}

// checkRefusals checks that each of op's responses that names idem's
// reasons is what the ServeMux answers to them.
func checkRefusals(t *testing.T, mux *runtime.ServeMux, doc *openAPI, op openAPIOperation) {
	reasonRE := regexp.MustCompile(`IDEMPOTENCY_[A-Z_]+`)
	var named []string
	for code, resp := range op.Responses {
		reasons := reasonRE.FindAllString(resp.Description, -1)
		if len(reasons) == 0 {
			continue
		}
		// A response of the method's own keeps its schema.
		var schema *openAPISchema
		if resp.Schema.Ref != "" {
			schema = doc.definition(t, resp.Schema.Ref)
		}
		for _, reason := range reasons {
			named = append(named, reason)
			err, ok := refusals[reason]
			if !ok {
				t.Errorf("response %s names %s, which the test does not know: add it to refusals", code, reason)
				continue
			}
			req := httptest.NewRequest(http.MethodPost, "/", nil)
			w := httptest.NewRecorder()
			runtime.HTTPError(context.Background(), mux, &runtime.JSONPb{}, w, req, err)
			if got := strconv.Itoa(w.Code); got != code {
				t.Errorf("%s is answered with %s; the document says %s", reason, got, code)
			}
			if ct := w.Header().Get("Content-Type"); !slices.Contains(op.Produces, ct) {
				t.Errorf("%s is sent as %s; the operation produces %q", reason, ct, op.Produces)
			}
			_, declared := resp.Headers["Retry-After"]
			if ra := w.Header().Get("Retry-After"); (ra != "") != declared {
				t.Errorf("%s is sent with Retry-After %q; the response %s declares headers %v", reason, ra, code, slices.Sorted(maps.Keys(resp.Headers)))
			}
			var body map[string]any
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatalf("%s: body %s: %v", reason, w.Body, err)
			}
			if body["reason"] != reason {
				t.Errorf("%s is sent with reason %v", reason, body["reason"])
			}
			if schema == nil {
				continue
			}
			fields := slices.Sorted(maps.Keys(body))
			if declared := slices.Sorted(maps.Keys(schema.Properties)); !slices.Equal(fields, declared) {
				t.Errorf("%s is sent with the fields %q; %s declares %q", reason, fields, resp.Schema.Ref, declared)
			}
			for _, f := range schema.Required {
				if _, ok := body[f]; !ok {
					t.Errorf("%s is sent without %s, which %s requires", reason, f, resp.Schema.Ref)
				}
			}
		}
	}
	for _, reason := range []string{idem.ReasonKeyInvalid, idem.ReasonKeyInUse, idem.ReasonKeyReused} {
		if !slices.Contains(named, reason) {
			t.Errorf("no response names %s", reason)
		}
	}
}

// checkAnswerHeaders checks that op's success and default responses
// declare the headers under which the ServeMux sends idem's response
// metadata.
func checkAnswerHeaders(t *testing.T, op openAPIOperation) {
	ctx := runtime.NewServerMetadataContext(context.Background(), runtime.ServerMetadata{
		HeaderMD: metadata.Pairs(idem.ReplayedHeader, "true", idem.ExpiresHeader, "2026-12-01T20:15:04Z"),
	})
	w := httptest.NewRecorder()
	// A recorded error, replayed: the default response.
	runtime.HTTPError(ctx, runtime.NewServeMux(idemgateway.ServeMuxOptions()...), &runtime.JSONPb{}, w,
		httptest.NewRequest(http.MethodPost, "/", nil), statusErr(codes.NotFound))
	var sent []string
	for name := range w.Header() {
		if strings.HasPrefix(strings.ToLower(name), "idempoten") {
			sent = append(sent, name)
		}
	}
	if len(sent) != 2 {
		t.Fatalf("a replayed error is sent with idem's headers %q; want 2", sent)
	}
	for _, code := range []string{"200", "default"} {
		resp, ok := op.Responses[code]
		if !ok {
			t.Errorf("no %s response", code)
			continue
		}
		for _, name := range sent {
			if _, ok := resp.Headers[name]; !ok {
				t.Errorf("response %s does not declare %s", code, name)
			}
		}
		if h := resp.Headers[idem.HTTPReplayedHeader]; !slices.Equal(h.Enum, []string{w.Header().Get(idem.HTTPReplayedHeader)}) {
			t.Errorf("response %s declares %s with the values %q; it is sent as %q", code, idem.HTTPReplayedHeader, h.Enum, w.Header().Get(idem.HTTPReplayedHeader))
		}
	}
}

// openAPI is what the test reads of an OpenAPI v2 document.
type openAPI struct {
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
	Description string `json:"description"`
	Schema      struct {
		Ref string `json:"$ref"`
	} `json:"schema"`
	Headers map[string]struct {
		Enum []string `json:"enum"`
	} `json:"headers"`
}

type openAPISchema struct {
	Properties map[string]any `json:"properties"`
	Required   []string       `json:"required"`
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

// definition returns the definition that ref names.
func (doc *openAPI) definition(t *testing.T, ref string) *openAPISchema {
	t.Helper()
	d, ok := doc.Definitions[strings.TrimPrefix(ref, "#/definitions/")]
	if !ok || !strings.HasPrefix(ref, "#/definitions/") {
		t.Fatalf("schema %q names no definition", ref)
	}
	return &d
}
