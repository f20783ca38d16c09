package main

import (
	"bytes"
	"encoding/json"
	"fmt"
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

// patchResponse patches the marked operations of res's files.
func patchResponse(res *pluginpb.CodeGeneratorResponse) error {
	for _, f := range res.GetFile() {
		if f.GetInsertionPoint() != "" || !strings.Contains(f.GetContent(), `"`+markName+`"`) {
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

// patchFile returns the OpenAPI v2 document doc with its marked operations
// patched.
func patchFile(doc []byte) (string, error) {
	var root map[string]any
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	if err := dec.Decode(&root); err != nil {
		return "", err
	}
	paths, _ := root["paths"].(map[string]any)
	patched := false
	for _, item := range paths {
		item, _ := item.(map[string]any)
		for verb, op := range item {
			op, ok := op.(map[string]any)
			if !ok || verb == "parameters" {
				continue
			}
			m, ok := op[markName]
			if !ok {
				continue
			}
			delete(op, markName)
			var k keyed
			if b, err := json.Marshal(m); err != nil {
				return "", err
			} else if err := json.Unmarshal(b, &k); err != nil {
				return "", fmt.Errorf("%s: %w", markName, err)
			}
			patchOperation(op, k, root["produces"])
			patched = true
		}
	}
	if !patched {
		return string(doc), nil
	}
	defs, _ := root["definitions"].(map[string]any)
	if defs == nil {
		defs = map[string]any{}
		root["definitions"] = defs
	}
	if _, ok := defs[problemDefinition]; ok {
		return "", fmt.Errorf("the definition %s exists already: it would be replaced by idem's problem details", problemDefinition)
	}
	defs[problemDefinition] = problemSchema()
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetIndent("", "  ") // as protoc-gen-openapiv2 writes
	if err := enc.Encode(root); err != nil {
		return "", err
	}
	return out.String(), nil
}

// patchOperation adds idem's parameter, responses, headers and media type
// to op, the operation of a keyed method. produces is the document's.
func patchOperation(op map[string]any, k keyed, produces any) {
	params, _ := op["parameters"].([]any)
	if !slices.ContainsFunc(params, func(v any) bool {
		p, _ := v.(map[string]any)
		name, _ := p["name"].(string)
		return p["in"] == "header" && strings.EqualFold(name, keyHeader)
	}) {
		op["parameters"] = append(params, map[string]any{
			"name":        keyHeader,
			"in":          "header",
			"description": keyDescription(k),
			"required":    k.Required && k.Field == "",
			"type":        "string",
		})
	}

	media := []any{}
	if p, ok := op["produces"].([]any); ok {
		media = p
	} else if p, ok := produces.([]any); ok {
		media = slices.Clone(p)
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
	for code, r := range responses {
		r, ok := r.(map[string]any)
		if !ok || !(strings.HasPrefix(code, "2") || code == "default") {
			continue
		}
		headers, _ := r["headers"].(map[string]any)
		if headers == nil {
			headers = map[string]any{}
			r["headers"] = headers
		}
		for name, h := range answerHeaders() {
			if _, ok := headers[name]; !ok {
				headers[name] = h
			}
		}
	}
	for code, r := range problemResponses(k) {
		mergeResponse(responses, code, r)
	}
}

// mergeResponse adds r to responses as the response of code. When the
// method's own openapiv2_operation option declares one, r's description is
// added to its description and r's headers to its own, and its schema
// stays: it says what the service's own errors carry.
func mergeResponse(responses map[string]any, code string, r map[string]any) {
	own, ok := responses[code].(map[string]any)
	if !ok {
		responses[code] = r
		return
	}
	description, _ := own["description"].(string)
	if description != "" {
		description += " "
	}
	own["description"] = description + "idem: " + r["description"].(string)
	add, _ := r["headers"].(map[string]any)
	if len(add) == 0 {
		return
	}
	headers, _ := own["headers"].(map[string]any)
	if headers == nil {
		headers = map[string]any{}
		own["headers"] = headers
	}
	for name, h := range add {
		if _, ok := headers[name]; !ok {
			headers[name] = h
		}
	}
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

// problemResponses are idem's refusals of a request to a method keyed as k.
func problemResponses(k keyed) map[string]map[string]any {
	schema := map[string]any{"$ref": "#/definitions/" + problemDefinition}
	bad := "The request's " + keyHeader + " is malformed, or sent more than once (reason IDEMPOTENCY_KEY_INVALID)"
	if k.Required {
		bad = "The request has no " + keyHeader + " and the operation requires one (reason IDEMPOTENCY_KEY_MISSING), " +
			"or it is malformed, or sent more than once (reason IDEMPOTENCY_KEY_INVALID)"
	}
	bad += ": problem details, as " + problemMediaType + ". " +
		"The service's own INVALID_ARGUMENT errors have the default error body."
	conflict := "A request with this " + keyHeader + " is still in flight (reason IDEMPOTENCY_KEY_IN_USE): " +
		"retry after the " + retryAfterHeader + " delay to get its answer."
	if k.Leased {
		conflict += " Or this request ran past its lease on the key and a retry took the key over " +
			"(reason IDEMPOTENCY_LEASE_LOST): retry after the delay to get the answer that stands."
	}
	conflict += " Problem details, as " + problemMediaType + "."
	return map[string]map[string]any{
		"400": {"description": bad, "schema": schema},
		"409": {
			"description": conflict,
			"schema":      schema,
			"headers": map[string]any{
				retryAfterHeader: map[string]any{
					"type":        "integer",
					"format":      "int32",
					"description": "Seconds to wait before retrying, rounded up.",
				},
			},
		},
		"422": {
			"description": "This " + keyHeader + " was used with a different request to this operation " +
				"(reason IDEMPOTENCY_KEY_REUSED): send a new key with a new request. Problem details, as " + problemMediaType + ".",
			"schema": schema,
		},
	}
}

// problemSchema is the definition of idem's problem details.
func problemSchema() map[string]any {
	str := func(description string) map[string]any {
		return map[string]any{"type": "string", "description": description}
	}
	return map[string]any{
		"type":        "object",
		"description": "Problem details (RFC 9457) of idem's refusal of a keyed request, sent as " + problemMediaType + ".",
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
