// Command noopdra serves the kubelet's DRA gRPC service (dra v1) and does no work: every
// claim of a NodePrepareResources call is answered at once as prepared (with one
// placeholder device, as the Python no-op servicer of the benchmarks answers) and every
// claim of a NodeUnprepareResources call as unprepared. It reads no claim, talks to no
// API server and writes no file: the floor of what a Go DRA driver's prepare can cost,
// for bench/prepare_helper_bench.py. Built by scripts/realk8s into the release's cache.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

type noop struct {
	drapb.UnimplementedDRAPluginServer
}

func (noop) NodePrepareResources(_ context.Context, req *drapb.NodePrepareResourcesRequest) (*drapb.NodePrepareResourcesResponse, error) {
	resp := &drapb.NodePrepareResourcesResponse{
		Claims: make(map[string]*drapb.NodePrepareResourceResponse, len(req.Claims)),
	}
	for _, c := range req.Claims {
		resp.Claims[c.Uid] = &drapb.NodePrepareResourceResponse{
			Devices: []*drapb.Device{{RequestNames: []string{"gpu"}, PoolName: "noop", DeviceName: "d"}},
		}
	}
	return resp, nil
}

func (noop) NodeUnprepareResources(_ context.Context, req *drapb.NodeUnprepareResourcesRequest) (*drapb.NodeUnprepareResourcesResponse, error) {
	resp := &drapb.NodeUnprepareResourcesResponse{
		Claims: make(map[string]*drapb.NodeUnprepareResourceResponse, len(req.Claims)),
	}
	for _, c := range req.Claims {
		resp.Claims[c.Uid] = &drapb.NodeUnprepareResourceResponse{}
	}
	return resp, nil
}

func main() {
	socket := flag.String("socket", "", "the unix socket to serve on (required)")
	flag.Parse()
	if *socket == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "noopdra: usage: noopdra --socket PATH")
		os.Exit(2)
	}
	// a socket file left by an earlier run would make the listen fail
	if err := os.Remove(*socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "noopdra: %v\n", err)
		os.Exit(1)
	}
	lis, err := net.Listen("unix", *socket)
	if err != nil {
		fmt.Fprintf(os.Stderr, "noopdra: %v\n", err)
		os.Exit(1)
	}
	server := grpc.NewServer()
	drapb.RegisterDRAPluginServer(server, noop{})
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	fmt.Printf("ready: %s\n", *socket)
	if err := server.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		fmt.Fprintf(os.Stderr, "noopdra: %v\n", err)
		os.Exit(1)
	}
}
