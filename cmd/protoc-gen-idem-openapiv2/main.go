// Command protoc-gen-idem-openapiv2 is a protoc plugin that runs
// grpc-gateway's protoc-gen-openapiv2 and adds to its OpenAPI v2 output
// what idem does over HTTP/JSON (package
// github.com/idemkit/idem/interceptor/idemgateway): every answer its
// ServeMux can give, with the schema of its body.
//
// A keyed method is a unary method with the option (idem.v1.method) whose
// idempotency_level is neither IDEMPOTENT nor NO_SIDE_EFFECTS. Each of its
// operations (one per google.api.http binding) gets:
//
//   - the header parameter Idempotency-Key, with idem's key rules, required
//     when the method sets key_required and its request has no key field
//     ((idem.v1.field).key, which can carry the key instead);
//   - the responses 400 (key missing or malformed, a scope that cannot hold
//     a key, a response too large to record; a leased call that could not
//     be finished), 409 (a request with the key is still in flight,
//     Retry-After; a leased call's lost lease) and 422 (key used with
//     another request), whose body is idem's problem details (RFC 9457),
//     and application/problem+json in produces; the default response
//     names the unreadable steps of a leased call (500);
//   - the headers Idempotent-Replayed and Idempotency-Key-Expires on every
//     response but 422: a recorded answer is replayed, errors too.
//
// Every other operation gets the response 400 and the media type: the
// ServeMux refuses a malformed Idempotency-Key header on every route, with
// problem details, before the service is called.
//
// # Two bodies, one schema
//
// A 400 or 409 answer, and a keyed operation's default one, is either
// idem's problem details, sent as application/problem+json, or an error of
// the service's own, such as an INVALID_ARGUMENT one, which grpc-gateway's
// error handler sends as a google.rpc.Status in application/json (and
// replays, recorded, with Idempotent-Replayed): a client generated from
// the document must read both. OpenAPI v2 gives a response one schema and has
// no oneOf, and its produces and examples name media types for the whole
// operation, not for one of its bodies, so the response's schema admits
// both: it is a definition named idemProblemOr followed by the name of
// the definition of the service's errors (idemProblemOrRpcStatus for
// protoc-gen-openapiv2's rpcStatus) that has the members of both
// (type, title, status, detail and reason; code, message and details),
// none required, a member both have with different types left untyped.
// The Content-Type of the answer says which body came. The service's
// errors are those the operation's response of that status already
// describes, else those of its default response; 422, which only idem
// sends, has the definition idemProblem, which requires its members, and
// so do 400 and 409 of an operation without a default response
// (protoc-gen-openapiv2's disable_default_errors), whose other errors the
// document does not describe. A schema that is not a reference to an object
// definition cannot be united with idem's and is an error.
//
// A file that declares no service gets no document (where
// protoc-gen-openapiv2 writes one without paths, such as one for idem's own
// options.proto when it is in the buf workspace, and merges its info into
// the document of allow_merge). A parameter or header the method's own
// openapiv2_operation option declares is kept, not replaced; so is a
// response, whose description gets idem's added to it, and whose schema
// is united with idem's as above.
//
// # Use
//
// Name protoc-gen-idem-openapiv2 instead of protoc-gen-openapiv2, with the
// same options; its arguments, if any, are the command that runs
// protoc-gen-openapiv2 (by default protoc-gen-openapiv2, found in PATH).
// With both pinned as tools (go get -tool) in buf.gen.yaml:
//
//	plugins:
//	  - local: [go, tool, protoc-gen-idem-openapiv2, go, tool, protoc-gen-openapiv2]
//	    out: gen/openapiv2
//
// The output must be JSON, protoc-gen-openapiv2's default: the plugin
// refuses output_format=yaml.
//
// # How
//
// The plugin marks the options of each keyed method with a vendor
// extension (x-idem-key), which protoc-gen-openapiv2 copies onto each
// operation of the method, wherever its naming and merging options put it;
// the plugin then patches the operations of the output, the marked ones as
// keyed, and removes the marks. It reads idem's options by name from the descriptors it is
// given, as protoc and buf give them, so it depends on no version of idem.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/pluginpb"
)

func main() {
	if err := run(os.Stdin, os.Stdout, os.Stderr, os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "protoc-gen-idem-openapiv2: %v\n", err)
		os.Exit(1)
	}
}

// defaultCommand runs protoc-gen-openapiv2 when the plugin is given no
// arguments.
var defaultCommand = []string{"protoc-gen-openapiv2"}

// run reads a CodeGeneratorRequest from in, has command (protoc-gen-openapiv2)
// generate from it with idem's marks, and writes the patched
// CodeGeneratorResponse to out. command's standard error goes to stderr.
func run(in io.Reader, out, stderr io.Writer, command []string) error {
	raw, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	req := &pluginpb.CodeGeneratorRequest{}
	if err := proto.Unmarshal(raw, req); err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	if err := checkParameter(req.GetParameter()); err != nil {
		return err
	}
	withServices(req)
	if err := mark(req); err != nil {
		return err
	}
	marked, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	if len(command) == 0 {
		command = defaultCommand
	}
	res, err := generate(command, marked, stderr)
	if err != nil {
		return err
	}
	if res.Error == nil {
		if err := patchResponse(res); err != nil {
			return err
		}
	}
	b, err := proto.Marshal(res)
	if err != nil {
		return err
	}
	_, err = out.Write(b)
	return err
}

// checkParameter refuses the protoc-gen-openapiv2 options whose output the
// plugin cannot patch.
func checkParameter(parameter string) error {
	for _, p := range strings.Split(parameter, ",") {
		name, value, _ := strings.Cut(strings.TrimSpace(p), "=")
		if name == "output_format" && value != "" && value != "json" {
			return fmt.Errorf("output_format=%s: only JSON output (the default) can be patched", value)
		}
	}
	return nil
}

// withServices leaves out of the files to generate those that declare no
// service.
func withServices(req *pluginpb.CodeGeneratorRequest) {
	services := map[string]bool{}
	for _, f := range req.GetProtoFile() {
		services[f.GetName()] = len(f.GetService()) > 0
	}
	req.FileToGenerate = slices.DeleteFunc(req.FileToGenerate, func(name string) bool { return !services[name] })
}

// generate runs command, a protoc plugin, with the request req.
func generate(command []string, req []byte, stderr io.Writer) (*pluginpb.CodeGeneratorResponse, error) {
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin = bytes.NewReader(req)
	cmd.Stderr = stderr
	out, err := cmd.Output()
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return nil, fmt.Errorf("%w: install protoc-gen-openapiv2 (github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2), or give the command that runs it as this plugin's arguments", err)
		}
		return nil, fmt.Errorf("%s: %w", strings.Join(command, " "), err)
	}
	res := &pluginpb.CodeGeneratorResponse{}
	if err := proto.Unmarshal(out, res); err != nil {
		return nil, fmt.Errorf("%s: its response: %w", strings.Join(command, " "), err)
	}
	return res, nil
}
