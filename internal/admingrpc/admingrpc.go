// Package admingrpc is a grpc-go client of idem's admin service, for the
// idem command, idem's tests and the examples'. The service has no
// generated gRPC code (interceptor.RegisterAdmin says why), so the client
// calls grpc.ClientConn.Invoke with the RPCs' full names; its method set
// is adminv1connect.AdminServiceClient's, so that one piece of code calls
// the service over grpc-go or connect-go. Programs outside idem call the
// service with the generated adminv1connect.NewAdminServiceClient, over
// Connect or, with connect.WithGRPC, gRPC.
package admingrpc

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	adminv1 "github.com/idemkit/idem/gen/idem/admin/v1"
)

// Client calls the admin service over a gRPC connection. Call options are
// the connection's (grpc.WithDefaultCallOptions).
type Client struct {
	cc grpc.ClientConnInterface
}

// NewClient returns a client of the admin service on cc.
func NewClient(cc grpc.ClientConnInterface) Client {
	return Client{cc: cc}
}

func (c Client) ListKeys(ctx context.Context, in *adminv1.ListKeysRequest) (*adminv1.ListKeysResponse, error) {
	return invoke[adminv1.ListKeysResponse](ctx, c.cc, "ListKeys", in)
}

func (c Client) GetKey(ctx context.Context, in *adminv1.GetKeyRequest) (*adminv1.GetKeyResponse, error) {
	return invoke[adminv1.GetKeyResponse](ctx, c.cc, "GetKey", in)
}

func (c Client) ForgetKey(ctx context.Context, in *adminv1.ForgetKeyRequest) (*adminv1.ForgetKeyResponse, error) {
	return invoke[adminv1.ForgetKeyResponse](ctx, c.cc, "ForgetKey", in)
}

func (c Client) SettleKey(ctx context.Context, in *adminv1.SettleKeyRequest) (*adminv1.SettleKeyResponse, error) {
	return invoke[adminv1.SettleKeyResponse](ctx, c.cc, "SettleKey", in)
}

func (c Client) FinishKey(ctx context.Context, in *adminv1.FinishKeyRequest) (*adminv1.FinishKeyResponse, error) {
	return invoke[adminv1.FinishKeyResponse](ctx, c.cc, "FinishKey", in)
}

func (c Client) ListAudit(ctx context.Context, in *adminv1.ListAuditRequest) (*adminv1.ListAuditResponse, error) {
	return invoke[adminv1.ListAuditResponse](ctx, c.cc, "ListAudit", in)
}

func (c Client) GetKeyStats(ctx context.Context, in *adminv1.GetKeyStatsRequest) (*adminv1.GetKeyStatsResponse, error) {
	return invoke[adminv1.GetKeyStatsResponse](ctx, c.cc, "GetKeyStats", in)
}

func (c Client) ForgetKeys(ctx context.Context, in *adminv1.ForgetKeysRequest) (*adminv1.ForgetKeysResponse, error) {
	return invoke[adminv1.ForgetKeysResponse](ctx, c.cc, "ForgetKeys", in)
}

func (c Client) SettleKeys(ctx context.Context, in *adminv1.SettleKeysRequest) (*adminv1.SettleKeysResponse, error) {
	return invoke[adminv1.SettleKeysResponse](ctx, c.cc, "SettleKeys", in)
}

func (c Client) FinishKeys(ctx context.Context, in *adminv1.FinishKeysRequest) (*adminv1.FinishKeysResponse, error) {
	return invoke[adminv1.FinishKeysResponse](ctx, c.cc, "FinishKeys", in)
}

// invoke calls the service's RPC name with in and returns its response.
func invoke[Resp any, PResp interface {
	*Resp
	proto.Message
}](ctx context.Context, cc grpc.ClientConnInterface, name string, in proto.Message) (PResp, error) {
	out := PResp(new(Resp))
	if err := cc.Invoke(ctx, "/idem.admin.v1.AdminService/"+name, in, out); err != nil {
		return nil, err
	}
	return out, nil
}
