package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/pluginpb"
)

// What idem sends over HTTP/JSON (package
// github.com/idemkit/idem/interceptor/idemgateway, whose tests check these
// names and statuses against what it does).
const (
	keyHeader        = "Idempotency-Key"
	replayedHeader   = "Idempotent-Replayed"
	expiresHeader    = "Idempotency-Key-Expires"
	retryAfterHeader = "Retry-After"
	problemMediaType = "application/problem+json"
	// problemDefinition names the definition of idem's problem details.
	problemDefinition = "idemProblem"
)

// patchResponse patches the operations of res's files.
func patchResponse(res *pluginpb.CodeGeneratorResponse) error {
	for _, f := range res.GetFile() {
		if f.GetInsertionPoint() != "" {
			continue
		}
		content, err := patchFile([]byte(f.GetContent()))
		if err != nil {
			return fmt.Errorf("%s: %w", f.GetName(), err)
		}
		f.Content = &content
	}
	return nil
}

// patchFile returns the OpenAPI v2 document doc with its operations
// patched: the marked ones as keyed, the others as operations that take no
// key.
func patchFile(doc []byte) (string, error) {
	var root map[string]any
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	if err := dec.Decode(&root); err != nil {
		return "", err
	}
	defs, _ := root["definitions"].(map[string]any)
	if defs == nil {
		defs = map[string]any{}
	}
	p := &patcher{defs: defs, produces: root["produces"], made: map[string]bool{}}
	paths, _ := root["paths"].(map[string]any)
	for _, item := range paths {
		item, _ := item.(map[string]any)
		for verb, op := range item {
			op, ok := op.(map[string]any)
			if !ok || verb == "parameters" {
				continue
			}
			if err := p.patchOperation(op); err != nil {
				return "", fmt.Errorf("%s: %w", op["operationId"], err)
			}
		}
	}
	if len(p.made) == 0 {
		return string(doc), nil
	}
	root["definitions"] = defs
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetIndent("", "  ") // as protoc-gen-openapiv2 writes
	if err := enc.Encode(root); err != nil {
		return "", err
	}
	return out.String(), nil
}

// patcher patches the operations of one document.
type patcher struct {
	// defs are the document's definitions, to which the patch adds idem's.
	defs map[string]any
	// produces is the document's produces.
	produces any
	// made holds the definitions the patch added.
	made map[string]bool
}

// patchOperation adds what idem does to op: its key parameter, headers and
// answers when op is marked as keyed, and to every operation the answer to
// a malformed Idempotency-Key header, which idemgateway refuses on every
// route.
func (p *patcher) patchOperation(op map[string]any) error {
	var k *keyed
	if m, ok := op[markName]; ok {
		delete(op, markName)
		k = &keyed{}
		if b, err := json.Marshal(m); err != nil {
			return err
		} else if err := json.Unmarshal(b, k); err != nil {
			return fmt.Errorf("%s: %w", markName, err)
		}
		addKeyParameter(op, *k)
	}

	media := []any{"application/json"} // grpc-gateway's, when the document says none
	if m, ok := op["produces"].([]any); ok {
		media = m
	} else if m, ok := p.produces.([]any); ok {
		media = slices.Clone(m)
	}
	if !slices.Contains(media, any(problemMediaType)) {
		media = append(media, problemMediaType)
	}
	op["produces"] = media

	responses, _ := op["responses"].(map[string]any)
	if responses == nil {
		responses = map[string]any{}
		op["responses"] = responses
	}
	answers := map[string]map[string]any{"400": {"description": exemptDescription}}
	if k != nil {
		answers = keyedResponses(*k)
	}
	// Each schema first, from the responses as protoc-gen-openapiv2 wrote
	// them: a 400 or 409 it wrote none for takes the default's errors.
	schemas := map[string]any{}
	for _, code := range slices.Sorted(maps.Keys(answers)) {
		s, err := p.errorSchema(responses, code)
		if err != nil {
			return err
		}
		schemas[code] = s
	}
	for code, r := range answers {
		own, _ := responses[code].(map[string]any)
		if own == nil {
			own = map[string]any{}
			responses[code] = own
		}
		description, _ := own["description"].(string)
		if description != "" {
			description += " idem: "
		}
		own["description"] = description + r["description"].(string)
		own["schema"] = schemas[code]
		addHeaders(own, r["headers"])
	}
	// The adapter turns the RetryInfo of any error, idem's or the
	// service's, into Retry-After.
	for code, r := range responses {
		if r, ok := r.(map[string]any); ok && !strings.HasPrefix(code, "2") {
			addHeaders(r, map[string]any{retryAfterHeader: retryAfterHeaderObject()})
		}
	}
	if k == nil {
		return nil
	}
	// A recorded answer, success or error, is replayed; only idem's 422
	// never is.
	for code, r := range responses {
		if r, ok := r.(map[string]any); ok && code != "422" {
			addHeaders(r, answerHeaders())
		}
	}
	return nil
}

// addKeyParameter adds the Idempotency-Key header parameter of a method
// keyed as k to op, unless op declares one.
func addKeyParameter(op map[string]any, k keyed) {
	params, _ := op["parameters"].([]any)
	if slices.ContainsFunc(params, func(v any) bool {
		p, _ := v.(map[string]any)
		name, _ := p["name"].(string)
		return p["in"] == "header" && strings.EqualFold(name, keyHeader)
	}) {
		return
	}
	op["parameters"] = append(params, map[string]any{
		"name":        keyHeader,
		"in":          "header",
		"description": keyDescription(k),
		"required":    k.Required && k.Field == "",
		"type":        "string",
	})
}

// addHeaders adds headers, a map of header objects, to the response r,
// except those r declares.
func addHeaders(r map[string]any, headers any) {
	add, _ := headers.(map[string]any)
	if len(add) == 0 {
		return
	}
	own, _ := r["headers"].(map[string]any)
	if own == nil {
		own = map[string]any{}
		r["headers"] = own
	}
	for name, h := range add {
		if _, ok := own[name]; !ok {
			own[name] = h
		}
	}
}

// errorSchema returns the schema of the response code of an operation
// whose responses are responses, which idem's problem details share with
// the service's own errors: those of the operation's own response code,
// else those of its default response, except for 422, which the service
// never sends. OpenAPI v2 gives a response one schema and has no oneOf, so
// the schema is a definition that unites the members of both (see
// unionSchema); with no error of the service's own, it is idem's problem
// details alone.
func (p *patcher) errorSchema(responses map[string]any, code string) (any, error) {
	if err := p.define(problemDefinition, problemSchema); err != nil {
		return nil, err
	}
	schema := func(code string) map[string]any {
		r, _ := responses[code].(map[string]any)
		s, _ := r["schema"].(map[string]any)
		return s
	}
	s := schema(code)
	if len(s) == 0 && code != "422" { // none, or {}: no body said
		s = schema("default")
	}
	if len(s) == 0 {
		return map[string]any{"$ref": "#/definitions/" + problemDefinition}, nil
	}
	ref, _ := s["$ref"].(string)
	name, ok := strings.CutPrefix(ref, "#/definitions/")
	def, _ := p.defs[name].(map[string]any)
	if !ok || def == nil || (def["type"] != nil && def["type"] != "object") {
		return nil, fmt.Errorf("response %s: idem's problem details cannot be described beside its schema %v, which is not a reference to an object definition", code, s)
	}
	if name == problemDefinition || p.made[name] {
		return s, nil
	}
	union := unionPrefix + strings.ToUpper(name[:1]) + name[1:]
	if err := p.define(union, func() map[string]any { return unionSchema(name, def) }); err != nil {
		return nil, err
	}
	return map[string]any{"$ref": "#/definitions/" + union}, nil
}

// define adds the definition name, made by schema, unless the patch did
// already; a definition of the document's own with that name is an error.
func (p *patcher) define(name string, schema func() map[string]any) error {
	if p.made[name] {
		return nil
	}
	if _, ok := p.defs[name]; ok {
		return fmt.Errorf("the definition %s exists already: it would be replaced by idem's", name)
	}
	p.defs[name] = schema()
	p.made[name] = true
	return nil
}

// keyDescription describes the Idempotency-Key header of a method keyed
// as k.
func keyDescription(k keyed) string {
	var b strings.Builder
	b.WriteString("The request's idempotency key (draft-ietf-httpapi-idempotency-key-header): " +
		"a new key for each new request, and the same key for every retry of it, so that the operation takes effect once. " +
		"A retry with the key gets the recorded answer, marked " + replayedHeader + ": true, " +
		"until the time the first answer's " + expiresHeader + " header gives. " +
		"A key is 1 to 255 characters of visible ASCII (0x21 to 0x7E), such as a UUID, " +
		"sent as a Structured Field String (\"8e03978e-40d5-43e8-bc93-6894a57f9324\") " +
		"or bare when it is a token (letters, digits and !#$%&'*+-.^_`|~). ")
	switch {
	case k.Required && k.Field != "":
		b.WriteString("Required, unless the request's field " + k.Field + " carries the key; when both do, they must be the same.")
	case k.Required:
		b.WriteString("Required.")
	case k.Field != "":
		b.WriteString("Optional: the request's field " + k.Field + " may carry the key instead (when both do, they must be the same); without a key, the operation runs on every request.")
	default:
		b.WriteString("Optional: without it, the operation runs on every request.")
	}
	return b.String()
}

// answerHeaders are idem's headers on the answers of the service: its
// responses, and its errors, which are recorded and replayed too.
// retryAfterHeaderObject is the header object of Retry-After.
func retryAfterHeaderObject() map[string]any {
	return map[string]any{
		"type":   "integer",
		"format": "int32",
		"description": "Seconds to wait before retrying, rounded up: sent when the error carries a google.rpc.RetryInfo, " +
			"as idem's do when the request's key is in use or its store failed.",
	}
}

func answerHeaders() map[string]any {
	return map[string]any{
		replayedHeader: map[string]any{
			"type": "string",
			"enum": []any{"true"},
			"description": "Present, with the value true, when this answer is the recorded answer " +
				"to an earlier request with the same " + keyHeader + ", replayed.",
		},
		expiresHeader: map[string]any{
			"type":   "string",
			"format": "date-time",
			"description": "When the request's " + keyHeader + " stops counting (RFC 3339, UTC): " +
				"a retry after it runs the operation again. Sent with the first answer and every replay of a keyed request.",
		},
	}
}

// exemptDescription describes the 400 response of an operation that takes
// no key.
const exemptDescription = "The request's " + keyHeader + " header, which this operation does not declare, is malformed, " +
	"or sent more than once (reason IDEMPOTENCY_KEY_INVALID): idem checks the header on every operation. " +
	"Problem details, as " + problemMediaType + ". " +
	"Or an error of the service's own (INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE), as application/json."

// keyedResponses are idem's answers to a request to a method keyed as k,
// beside its success, by status.
func keyedResponses(k keyed) map[string]map[string]any {
	bad := "The request's " + keyHeader + " is malformed, or sent more than once (reason IDEMPOTENCY_KEY_INVALID)"
	if k.Required {
		bad = "The request has no " + keyHeader + " and the operation requires one (reason IDEMPOTENCY_KEY_MISSING), " +
			"or it is malformed, or sent more than once (reason IDEMPOTENCY_KEY_INVALID)"
	}
	bad += ", or the request's scope cannot hold a key (reason IDEMPOTENCY_SCOPE_INVALID), " +
		"or its answer was too large to record and cannot be rebuilt (reason IDEMPOTENCY_RESPONSE_NOT_CACHED)"
	if k.Leased {
		bad += ", or it was abandoned and could not be finished (reason IDEMPOTENCY_NOT_FINISHED, replayed to retries)"
	}
	bad += ". Problem details, as " + problemMediaType + ". " +
		"Or an error of the service's own (INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE), as application/json; " +
		"recorded, it is replayed to retries."
	conflict := "A request with this " + keyHeader + " is still in flight (reason IDEMPOTENCY_KEY_IN_USE): " +
		"retry after the " + retryAfterHeader + " delay to get its answer."
	if k.Leased {
		conflict += " Or this request ran past its lease on the key and a retry took the key over " +
			"(reason IDEMPOTENCY_LEASE_LOST): retry after the delay to get the answer that stands."
	}
	conflict += " Problem details, as " + problemMediaType + ". " +
		"Or an error of the service's own (ABORTED, ALREADY_EXISTS), or a conflict in idem's store with another request (ABORTED: retry), " +
		"as application/json; a recorded error is replayed to retries."
	other := "The service's other errors, and idem's when its store fails (UNAVAILABLE: retry after the " + retryAfterHeader +
		" delay), as application/json; a recorded error is replayed to retries."
	if k.Leased {
		other += " A request whose saved steps cannot be read is answered with 500 (reason IDEMPOTENCY_STEPS_UNREADABLE): " +
			"problem details, as " + problemMediaType + "."
	}
	return map[string]map[string]any{
		"400": {"description": bad},
		"409": {"description": conflict},
		"422": {
			"description": "This " + keyHeader + " was used with a different request to this operation " +
				"(reason IDEMPOTENCY_KEY_REUSED): send a new key with a new request. Problem details, as " + problemMediaType + ".",
		},
		"default": {"description": other},
	}
}

// unionPrefix begins the name of a definition that unites idem's problem
// details with the error definition whose name follows.
const unionPrefix = "idemProblemOr"

// unionSchema is the definition that unites idem's problem details with
// def, the definition name of the service's own errors: OpenAPI v2 gives a
// response one schema and has no oneOf, so this one has the members of
// both, none required, and a client generated from it reads either body.
// A member both have with different types has none: any JSON value.
func unionSchema(name string, def map[string]any) map[string]any {
	props := map[string]any{}
	own, _ := def["properties"].(map[string]any)
	for member, s := range own {
		props[member] = s
	}
	for member, s := range problemSchema()["properties"].(map[string]any) {
		if o, ok := props[member].(map[string]any); ok {
			if !sameType(o, s.(map[string]any)) {
				props[member] = map[string]any{"description": "Any JSON value: " + name + " and idem's problem details give " + member + " different types."}
			}
			continue
		}
		props[member] = s
	}
	return map[string]any{
		"type": "object",
		"description": "An error: either idem's problem details (" + problemDefinition + "), sent as " + problemMediaType +
			", or an error of the service's own (" + name + "), sent as application/json; the Content-Type says which. " +
			"OpenAPI v2 gives a response one schema and has no oneOf, so this one has the members of both, none required.",
		"properties": props,
	}
}

// sameType reports whether the schemas a and b give a value the same type.
func sameType(a, b map[string]any) bool {
	for _, k := range []string{"type", "format", "$ref", "items"} {
		if !reflect.DeepEqual(a[k], b[k]) {
			return false
		}
	}
	return true
}

// problemSchema is the definition of idem's problem details.
func problemSchema() map[string]any {
	str := func(description string) map[string]any {
		return map[string]any{"type": "string", "description": description}
	}
	return map[string]any{
		"type":        "object",
		"description": "Problem details (RFC 9457) of idem's refusal of a request, sent as " + problemMediaType + ".",
		"properties": map[string]any{
			"type":   str("A URI that names the problem: the documentation of its reason."),
			"title":  str("A short summary of the problem."),
			"status": map[string]any{"type": "integer", "format": "int32", "description": "The HTTP status code of the answer."},
			"detail": str("What happened, and what to do about it."),
			"reason": str("idem's reason for the refusal, that of the google.rpc.ErrorInfo (domain idem) of the gRPC error, such as IDEMPOTENCY_KEY_REUSED."),
		},
		"required": []any{"type", "title", "status", "detail", "reason"},
	}
}
