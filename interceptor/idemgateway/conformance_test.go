package idemgateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor/idemgateway"
	"github.com/idemkit/idem/internal/idemtest/grpctest"
	"github.com/idemkit/idem/transport"
	"github.com/idemkit/idem/transport/transporttest"
)

// TestConformance runs the transport conformance suite over HTTP/JSON:
// grpc-gateway with idemgateway's options, in front of a gRPC server with
// idem's interceptors.
func TestConformance(t *testing.T) {
	transporttest.Run(t, transporttest.HarnessFunc(serveGateway))
}

// serveGateway serves the unary methods of the test service with h on a
// gRPC server with idem's interceptors on e, and in front of it a
// grpc-gateway ServeMux with idemgateway's options, each method on POST
// /<service>/<method> with the request as the body, as generated code
// registers a route; it returns a client of the gateway.
func serveGateway(t *testing.T, e *idem.Engine, h transporttest.Handler) transporttest.Client {
	t.Helper()
	conn := grpctest.Dial(t, grpctest.Serve(t, e, h))
	mux := runtime.NewServeMux(append(idemgateway.ServeMuxOptions(),
		runtime.WithIncomingHeaderMatcher(idemgateway.IncomingHeaderMatcher(tenantHeaders)))...)
	for full, md := range grpctest.UnaryMethods() {
		err := mux.HandlePath(http.MethodPost, full, func(w http.ResponseWriter, r *http.Request, _ map[string]string) {
			ctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			inbound, outbound := runtime.MarshalerForRequest(mux, r)
			ctx, err := runtime.AnnotateContext(ctx, mux, r, full, runtime.WithHTTPPathPattern(full))
			if err != nil {
				runtime.HTTPError(ctx, mux, outbound, w, r, err)
				return
			}
			req, resp := grpctest.NewMessage(md.Input()), grpctest.NewMessage(md.Output())
			if err := inbound.NewDecoder(r.Body).Decode(req); err != nil && !errors.Is(err, io.EOF) {
				runtime.HTTPError(ctx, mux, outbound, w, r, status.Error(codes.InvalidArgument, err.Error()))
				return
			}
			var meta runtime.ServerMetadata
			err = conn.Invoke(ctx, full, req, resp, grpc.Header(&meta.HeaderMD), grpc.Trailer(&meta.TrailerMD))
			ctx = runtime.NewServerMetadataContext(ctx, meta)
			if err != nil {
				runtime.HTTPError(ctx, mux, outbound, w, r, err)
				return
			}
			runtime.ForwardResponseMessage(ctx, mux, outbound, w, r, resp)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return gatewayClient{url: hs.URL}
}

// gatewayClient is the suite's client over HTTP/JSON.
type gatewayClient struct{ url string }

// problemCodes are the codes idem's problem details stand for, by HTTP
// status.
var problemCodes = map[int]code.Code{
	http.StatusBadRequest:          code.Code_INVALID_ARGUMENT,
	http.StatusConflict:            code.Code_ABORTED,
	http.StatusUnprocessableEntity: code.Code_FAILED_PRECONDITION,
}

func (c gatewayClient) Call(ctx context.Context, r transporttest.Request) (transporttest.Response, error) {
	body, err := protojson.Marshal(r.Message)
	if err != nil {
		return transporttest.Response{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+r.Method, bytes.NewReader(body))
	if err != nil {
		return transporttest.Response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("TE", "trailers") // for grpc-gateway to send the trailers
	for _, k := range r.Keys {
		req.Header.Add(idem.HTTPKeyHeader, transport.FormatHTTPKey(k))
	}
	for k, v := range r.Header {
		req.Header.Set(k, v)
	}
	hr, err := http.DefaultClient.Do(req)
	if err != nil {
		return transporttest.Response{}, err
	}
	defer hr.Body.Close()
	b, err := io.ReadAll(hr.Body)
	if err != nil {
		return transporttest.Response{}, err
	}
	resp := transporttest.Response{
		Header:   forwarded(hr.Header, runtime.MetadataHeaderPrefix),
		Trailer:  forwarded(hr.Trailer, runtime.MetadataTrailerPrefix),
		Replayed: hr.Header.Get(idem.HTTPReplayedHeader) == "true",
	}
	switch {
	case hr.StatusCode == http.StatusOK:
		if err := protojson.Unmarshal(b, r.Response); err != nil {
			return resp, err
		}
		resp.Message, resp.Body = r.Response, b
		return resp, nil
	case hr.Header.Get("Content-Type") == "application/problem+json":
		var p struct {
			Status int    `json:"status"`
			Detail string `json:"detail"`
			Reason string `json:"reason"`
		}
		if err := json.Unmarshal(b, &p); err != nil {
			return resp, err
		}
		c, ok := problemCodes[p.Status]
		if !ok || p.Status != hr.StatusCode {
			return resp, errors.New("a problem of status " + strconv.Itoa(p.Status) + " came with " + hr.Status)
		}
		resp.Err = &transporttest.Error{Code: c, Message: p.Detail, Reason: p.Reason}
	case hr.Header.Get("Content-Type") != "application/json":
		return resp, errors.New("an error answered as " + hr.Header.Get("Content-Type") + ", not a problem detail nor a google.rpc.Status in JSON")
	default:
		st := new(spb.Status)
		if err := protojson.Unmarshal(b, st); err != nil {
			return resp, err
		}
		resp.Err = transporttest.ErrorFromStatus(st)
	}
	if s, err := strconv.Atoi(hr.Header.Get("Retry-After")); err == nil {
		resp.Err.RetryAfter = time.Duration(s) * time.Second
	}
	return resp, nil
}

// forwarded returns h with lower-case names, and without prefix those
// that carry it: the metadata grpc-gateway forwarded.
func forwarded(h http.Header, prefix string) map[string][]string {
	md := make(map[string][]string, len(h))
	for k, v := range h {
		md[strings.TrimPrefix(strings.ToLower(k), strings.ToLower(prefix))] = v
	}
	return md
}
