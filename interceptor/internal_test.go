package interceptor_test

import "google.golang.org/grpc"

var mutateInfo = &grpc.UnaryServerInfo{FullMethod: "/idemgate.testing.v1.TestService/Mutate"}
