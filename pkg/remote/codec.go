package remote

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
)

// frame is every gRPC message of the service: bytes in the wire encoding
// (wire.go). The codec passes them through, so gRPC does no encoding of
// its own and the main module needs no generated code. It is forced per
// server and per call (grpc.ForceServerCodec, grpc.ForceCodec), not
// registered globally.
type frame struct{ b []byte }

type rawCodec struct{}

func (rawCodec) Name() string { return "cdcflow-raw" }

func (rawCodec) Marshal(v any) ([]byte, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("remote: codec: cannot marshal %T", v)
	}
	return f.b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("remote: codec: cannot unmarshal into %T", v)
	}
	// A fresh copy every time: gRPC reuses data, and a data frame's
	// decoded rows keep f.b (decodeMessages), so f.b is never reused
	// either, even by a caller that receives into the same frame again.
	f.b = append([]byte(nil), data...)
	return nil
}

// serviceName carries the wire version: a peer of another version asks
// for a service this one does not serve, and gRPC refuses it
// (Unimplemented) before any frame is decoded.
const (
	serviceName   = "cdcflow.remote.v3.EventService"
	controlMethod = "/" + serviceName + "/Control"
	dataMethod    = "/" + serviceName + "/Data"
)

// handler is what the gRPC service calls; Server implements it.
type handler interface {
	// receiveControl reads a control call's request with dec.
	receiveControl(ctx context.Context, dec func(any) error) ([]byte, error)
	control(ctx context.Context, req []byte) ([]byte, error)
	data(stream grpc.ServerStream) error
}

// serviceDesc describes the service by hand: one unary call for the
// control plane, one bidirectional stream per collector for data (down)
// and credit (up).
func serviceDesc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: serviceName,
		HandlerType: (*handler)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Control",
			// As generated code does, the handler runs through the server's
			// unary interceptor (grpc.UnaryInterceptor) when there is one;
			// stream interceptors are applied by gRPC itself.
			Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				b, err := srv.(handler).receiveControl(ctx, dec)
				if err != nil {
					return nil, err
				}
				req := frame{b: b}
				call := func(ctx context.Context, r any) (any, error) {
					b, err := srv.(handler).control(ctx, r.(*frame).b)
					if err != nil {
						return nil, err
					}
					return &frame{b: b}, nil
				}
				if interceptor == nil {
					return call(ctx, &req)
				}
				return interceptor(ctx, &req, &grpc.UnaryServerInfo{Server: srv, FullMethod: controlMethod}, call)
			},
		}},
		Streams: []grpc.StreamDesc{{
			StreamName:    "Data",
			Handler:       func(srv any, stream grpc.ServerStream) error { return srv.(handler).data(stream) },
			ServerStreams: true,
			ClientStreams: true,
		}},
	}
}
