package payments

import (
	"context"
	"errors"

	"connectrpc.com/connect"
	"google.golang.org/grpc/status"

	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/gen/examples/payments/v1/paymentsv1connect"
)

// ConnectHandler serves a Server over Connect (and gRPC and gRPC-Web through
// connect-go): paymentsv1connect.PaymentsServiceHandler, to build with
// connectgate's Gate.HandlerOptions (its interceptor and limits) and wrap in
// its Gate.HTTPMiddleware, as payments-server does. Its errors are the Server's, as Connect errors
// of the same code and message.
type ConnectHandler struct {
	paymentsv1connect.UnimplementedPaymentsServiceHandler
	// Server does the work.
	Server *Server
}

// ChargeCard implements paymentsv1connect.PaymentsServiceHandler.
func (h ConnectHandler) ChargeCard(ctx context.Context, req *connect.Request[paymentsv1.ChargeCardRequest]) (*connect.Response[paymentsv1.ChargeCardResponse], error) {
	return respond(h.Server.ChargeCard(ctx, req.Msg))
}

// SendReceipt implements paymentsv1connect.PaymentsServiceHandler.
func (h ConnectHandler) SendReceipt(ctx context.Context, req *connect.Request[paymentsv1.SendReceiptRequest]) (*connect.Response[paymentsv1.SendReceiptResponse], error) {
	return respond(h.Server.SendReceipt(ctx, req.Msg))
}

// GetBalance implements paymentsv1connect.PaymentsServiceHandler.
func (h ConnectHandler) GetBalance(ctx context.Context, req *connect.Request[paymentsv1.GetBalanceRequest]) (*connect.Response[paymentsv1.GetBalanceResponse], error) {
	return respond(h.Server.GetBalance(ctx, req.Msg))
}

// respond wraps a gRPC handler's answer for Connect.
func respond[T any](msg *T, err error) (*connect.Response[T], error) {
	if err != nil {
		if st, ok := status.FromError(err); ok {
			return nil, connect.NewError(connect.Code(st.Code()), errors.New(st.Message()))
		}
		return nil, err
	}
	return connect.NewResponse(msg), nil
}
