// Command fakecri serves the CRI runtime and image services from memory, so that a real
// kubelet runs pods on this machine without a container runtime: sandboxes and
// containers are records, nothing is executed. Built by scripts/realk8s into the
// release's cache; the kubelet reaches it at --endpoint.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

func main() {
	endpoint := flag.String("endpoint", "", "where to serve the CRI, unix:///path/to/socket")
	root := flag.String("fs-root", "/", "the mount point reported as the image filesystem")
	flag.Parse()
	if *endpoint == "" {
		fmt.Fprintln(os.Stderr, "fakecri: --endpoint is required")
		os.Exit(2)
	}
	runtime := fake.NewFakeRemoteRuntime()
	// Both default to nil: the kubelet then falls back to its configured cgroup driver,
	// and the eviction manager finds no image filesystem and logs every sync.
	runtime.RuntimeService.FakeLinuxConfiguration = &runtimeapi.LinuxRuntimeConfiguration{
		CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS,
	}
	usage := []*runtimeapi.FilesystemUsage{{
		Timestamp:  time.Now().UnixNano(),
		FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: *root},
		UsedBytes:  &runtimeapi.UInt64Value{Value: 1 << 20},
		InodesUsed: &runtimeapi.UInt64Value{Value: 16},
	}}
	runtime.ImageService.SetFakeFilesystemUsage(usage)
	// every image "pulled" gets this size; at 0 the kubelet refuses to create containers
	runtime.ImageService.SetFakeImageSize(1 << 20)
	runtime.ImageService.SetFakeContainerFilesystemUsage(usage)
	if err := runtime.Start(*endpoint); err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("fakecri: serving %s\n", *endpoint)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	runtime.Stop()
}
