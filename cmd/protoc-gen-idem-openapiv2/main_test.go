package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

var update = flag.Bool("update", false, "rewrite testdata/cases.swagger.json with what buf generates")

// TestBufGenerate runs buf generate, at the version idem's tools pin, with
// the plugin as a user's buf.gen.yaml names it and protoc-gen-openapiv2 (the
// version idem's tools pin) found in PATH, on testdata/proto and the files it
// imports, and compares the OpenAPI document with
// testdata/cases.swagger.json (rewrite it with -update): a keyed method, one
// with no idem option, an IDEMPOTENT one, and a leased one with a key field,
// two bindings and an openapiv2_operation option of its own.
func TestBufGenerate(t *testing.T) {
	bin := t.TempDir()
	goCmd(t, "build", "-o", bin, ".")
	buf := strings.TrimSpace(goCmd(t, "tool", "-n", "-modfile=../../tools/go.mod", "buf"))
	openapiv2 := strings.TrimSpace(goCmd(t, "tool", "-n", "-modfile=../../tools/go.mod", "protoc-gen-openapiv2"))
	link(t, openapiv2, filepath.Join(bin, "protoc-gen-openapiv2"))
	gateway := strings.TrimSpace(goCmd(t, "list", "-m", "-f", "{{.Dir}}", "github.com/grpc-ecosystem/grpc-gateway/v2"))

	work := t.TempDir()
	for dst, src := range map[string]string{
		"proto":                               "testdata/proto",
		"idem/idem/v1/options.proto":          "../../proto/idem/v1/options.proto",
		"google/google/api/http.proto":        "../../examples/proto/google/api/http.proto",
		"google/google/api/annotations.proto": "../../examples/proto/google/api/annotations.proto",
		"openapiv2/protoc-gen-openapiv2/options/annotations.proto": filepath.Join(gateway, "protoc-gen-openapiv2/options/annotations.proto"),
		"openapiv2/protoc-gen-openapiv2/options/openapiv2.proto":   filepath.Join(gateway, "protoc-gen-openapiv2/options/openapiv2.proto"),
	} {
		copyTree(t, src, filepath.Join(work, dst))
	}
	for name, content := range map[string]string{
		"buf.yaml": "version: v2\nmodules:\n  - path: proto\n  - path: idem\n  - path: google\n  - path: openapiv2\n",
		"buf.gen.yaml": `version: v2
plugins:
  - local: protoc-gen-idem-openapiv2
    out: out
`,
	} {
		if err := os.WriteFile(filepath.Join(work, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	cmd := exec.Command(buf, "generate", "--path", "proto/openapi")
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("buf generate: %v\n%s", err, out)
	}
	got, err := os.ReadFile(filepath.Join(work, "out/openapi/v1/cases.swagger.json"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(got, []byte(markName)) {
		t.Errorf("the output still holds the mark %s", markName)
	}
	golden := filepath.Join("testdata", "cases.swagger.json")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("buf generate wrote\n%s\nwant (%s)\n%s", got, golden, want)
	}
}

// TestPatchFileNoOperations: a document without operations is returned
// byte for byte, as protoc-gen-openapiv2 wrote it.
func TestPatchFileNoOperations(t *testing.T) {
	doc := "{\n  \"swagger\": \"2.0\",\n  \"paths\": {}\n}\n"
	got, err := patchFile([]byte(doc))
	if err != nil || got != doc {
		t.Fatalf("patchFile = %q, %v; want the document unchanged", got, err)
	}
}

// TestPatchFileDefinitionClash: a definition of the service's own with
// the name of one of idem's is not overwritten.
func TestPatchFileDefinitionClash(t *testing.T) {
	for _, name := range []string{problemDefinition, unionPrefix + "RpcStatus"} {
		doc := `{"paths": {"/v1/x": {"post": {"x-idem-key": {"required": true}, "responses": {"default": {"schema": {"$ref": "#/definitions/rpcStatus"}}}}}},
			"definitions": {"rpcStatus": {"type": "object"}, "` + name + `": {}}}`
		if _, err := patchFile([]byte(doc)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: patchFile: %v; want an error naming it", name, err)
		}
	}
}

// TestPatchFileErrorSchemas: the schema of a response that idem's problem
// details share with the service's own errors unites both, members
// typed differently left untyped; with no error schema of the service's
// own, it is idem's problem details; one the patch cannot unite with
// them is an error that names the response.
func TestPatchFileErrorSchemas(t *testing.T) {
	// patch patches a document whose one operation has responses, and
	// returns the $ref of its 400 response's schema and the definitions.
	patch := func(t *testing.T, responses string) (string, map[string]any, error) {
		t.Helper()
		doc := `{"paths": {"/v1/x": {"get": {"responses": ` + responses + `}}},
			"definitions": {"apiError": {"type": "object", "properties": {"status": {"type": "string"}, "title": {"type": "string"}, "code": {"type": "integer"}}}}}`
		out, err := patchFile([]byte(doc))
		if err != nil {
			return "", nil, err
		}
		var root struct {
			Paths map[string]map[string]struct {
				Responses map[string]struct {
					Schema struct {
						Ref string `json:"$ref"`
					} `json:"schema"`
				} `json:"responses"`
			} `json:"paths"`
			Definitions map[string]any `json:"definitions"`
		}
		if err := json.Unmarshal([]byte(out), &root); err != nil {
			t.Fatal(err)
		}
		return root.Paths["/v1/x"]["get"].Responses["400"].Schema.Ref, root.Definitions, nil
	}
	t.Run("united", func(t *testing.T) {
		ref, defs, err := patch(t, `{"default": {"schema": {"$ref": "#/definitions/apiError"}}}`)
		if err != nil {
			t.Fatal(err)
		}
		if ref != "#/definitions/"+unionPrefix+"ApiError" {
			t.Fatalf("400's schema is %q; want the union %sApiError", ref, unionPrefix)
		}
		union := defs[unionPrefix+"ApiError"].(map[string]any)
		props := union["properties"].(map[string]any)
		if got := slices.Sorted(maps.Keys(props)); !slices.Equal(got, []string{"code", "detail", "reason", "status", "title", "type"}) {
			t.Errorf("members %q; want apiError's and the problem's", got)
		}
		if _, typed := props["status"].(map[string]any)["type"]; typed || props["title"].(map[string]any)["type"] != "string" {
			t.Errorf("status %v, title %v; want status untyped (string and integer), title a string", props["status"], props["title"])
		}
		if _, ok := union["required"]; ok {
			t.Errorf("the union requires %v; want nothing required", union["required"])
		}
	})
	t.Run("no error schema", func(t *testing.T) {
		ref, _, err := patch(t, `{"200": {}}`)
		if err != nil {
			t.Fatal(err)
		}
		if ref != "#/definitions/"+problemDefinition {
			t.Fatalf("400's schema is %q; want %s", ref, problemDefinition)
		}
	})
	t.Run("inline schema", func(t *testing.T) {
		_, _, err := patch(t, `{"default": {"schema": {"type": "string"}}}`)
		if err == nil || !strings.Contains(err.Error(), "response 400") {
			t.Fatalf("patchFile: %v; want an error naming response 400", err)
		}
	})
}

// TestYAMLRefused: YAML output cannot be patched, and the plugin says so
// before it runs protoc-gen-openapiv2.
func TestYAMLRefused(t *testing.T) {
	param := "allow_merge=true,output_format=yaml"
	req := marshal(t, &pluginpb.CodeGeneratorRequest{Parameter: &param})
	err := run(bytes.NewReader(req), io.Discard, io.Discard, []string{"protoc-gen-openapiv2-absent"})
	if err == nil || !strings.Contains(err.Error(), "output_format=yaml") {
		t.Fatalf("run: %v; want an error naming output_format=yaml", err)
	}
}

// TestCommandMissing: without protoc-gen-openapiv2 the error says what to
// install.
func TestCommandMissing(t *testing.T) {
	req := marshal(t, &pluginpb.CodeGeneratorRequest{})
	err := run(bytes.NewReader(req), io.Discard, io.Discard, []string{"protoc-gen-openapiv2-absent"})
	if !errors.Is(err, exec.ErrNotFound) || !strings.Contains(err.Error(), "install protoc-gen-openapiv2") {
		t.Fatalf("run: %v; want exec.ErrNotFound, saying what to install", err)
	}
}

func marshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// goCmd runs the go command in the module, outside any workspace, and
// returns what it printed.
func goCmd(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if exit := (*exec.ExitError)(nil); errors.As(err, &exit) {
			stderr = exit.Stderr
		}
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

// link makes dst a symbolic link to the file src.
func link(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.Symlink(src, dst); err != nil {
		t.Fatal(err)
	}
}

// copyTree copies the file or directory src to dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestWithServices: a file that declares no service is not generated.
func TestWithServices(t *testing.T) {
	req := &pluginpb.CodeGeneratorRequest{
		FileToGenerate: []string{"idem/v1/options.proto", "shop/v1/shop.proto"},
		ProtoFile: []*descriptorpb.FileDescriptorProto{
			{Name: proto.String("idem/v1/options.proto")},
			{Name: proto.String("shop/v1/shop.proto"), Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("ShopService")}}},
		},
	}
	withServices(req)
	if got := req.GetFileToGenerate(); !slices.Equal(got, []string{"shop/v1/shop.proto"}) {
		t.Fatalf("files to generate %q; want shop/v1/shop.proto alone", got)
	}
}
