// Command helperdriver is a small DRA driver built on the upstream kubeletplugin helper
// (k8s.io/dynamic-resource-allocation/kubeletplugin) of the release it is compiled
// against: a peer for drahealth's real-kubelet tests. It publishes one ResourceSlice
// with --devices devices in the pool named after its node, prepares claims by writing
// a CDI spec per claim and a checkpoint of what it holds prepared, and streams device
// health read from a JSON file (--health-file) to the kubelet.
//
// The helper's health API differs by release: from v0.37 the driver implements the
// version-neutral WatchHealthStatus and the helper serves dra-health v1 and v1alpha1;
// before, the helper serves v1alpha1 only when the driver itself is a v1alpha1
// DRAResourceHealth server. health_v1.go and health_v1alpha1.go hold the two, picked
// by the helper_v1alpha1 build tag; everything else is shared.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

type config struct {
	driverName    string
	nodeName      string
	kubeconfig    string
	registryDir   string
	pluginsDir    string
	cdiDir        string
	devices       int
	healthFile    string
	healthTimeout int
	kubeAPIQPS    float64
	kubeAPIBurst  int
}

func (c *config) validate() error {
	for _, req := range []struct{ flag, value string }{
		{"--driver-name", c.driverName},
		{"--node-name", c.nodeName},
		{"--kubeconfig", c.kubeconfig},
		{"--registry-dir", c.registryDir},
		{"--plugins-dir", c.pluginsDir},
		{"--cdi-dir", c.cdiDir},
		{"--health-file", c.healthFile},
	} {
		if req.value == "" {
			return fmt.Errorf("%s is required", req.flag)
		}
	}
	if c.devices < 1 {
		return fmt.Errorf("--devices must be at least 1, not %d", c.devices)
	}
	if c.kubeAPIQPS <= 0 || c.kubeAPIBurst < 1 {
		return fmt.Errorf("--kube-api-qps must be above 0 and --kube-api-burst at least 1")
	}
	if c.healthTimeout < 1 {
		return fmt.Errorf("--health-timeout must be at least 1 (seconds), not %d", c.healthTimeout)
	}
	return nil
}

func main() { os.Exit(run()) }

func run() int {
	fs := flag.NewFlagSet("helperdriver", flag.ContinueOnError)
	klog.InitFlags(fs)
	var cfg config
	fs.StringVar(&cfg.driverName, "driver-name", "gpu.example.com", "the DRA driver name")
	fs.StringVar(&cfg.nodeName, "node-name", "", "the node this driver runs on; also its pool name (required)")
	fs.StringVar(&cfg.kubeconfig, "kubeconfig", "", "kubeconfig for the API server (required)")
	fs.StringVar(&cfg.registryDir, "registry-dir", "", "the kubelet's plugin registration directory (required)")
	fs.StringVar(&cfg.pluginsDir, "plugins-dir", "", "parent of the driver's socket directory <plugins-dir>/<driver> (required)")
	fs.StringVar(&cfg.cdiDir, "cdi-dir", "", "where CDI specs of prepared claims are written (required)")
	fs.IntVar(&cfg.devices, "devices", 4, "number of devices, gpu-0 .. gpu-<n-1>")
	fs.StringVar(&cfg.healthFile, "health-file", "", "JSON health of the devices, re-read every 200 ms (required)")
	fs.IntVar(&cfg.healthTimeout, "health-timeout", 30, "seconds the kubelet trusts a device's health report")
	// client-go's own defaults; drivers expose them as these flags (a prepare fetches
	// its claim through this client, so a burst of prepares is held to this rate)
	fs.Float64Var(&cfg.kubeAPIQPS, "kube-api-qps", 5, "API requests per second the client may make")
	fs.IntVar(&cfg.kubeAPIBurst, "kube-api-burst", 10, "API requests the client may make at once above the rate")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "helperdriver: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "helperdriver: %v\n", err)
		return 2
	}
	defer klog.Flush()
	if err := serve(cfg); err != nil {
		klog.ErrorS(err, "helperdriver failed")
		return 1
	}
	return 0
}

// serve runs the driver until SIGINT/SIGTERM (nil) or a fatal error (returned).
func serve(cfg config) error {
	sigCtx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stopSignals()
	ctx, cancel := context.WithCancel(sigCtx)
	defer cancel()
	fatal := make(chan error, 1) // the first non-recoverable error; it stops the driver
	logger := klog.Background().WithName("helperdriver")
	ctx = klog.NewContext(ctx, logger)

	restConfig, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig %s: %w", cfg.kubeconfig, err)
	}
	restConfig.QPS, restConfig.Burst = float32(cfg.kubeAPIQPS), cfg.kubeAPIBurst
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return fmt.Errorf("client for %s: %w", cfg.kubeconfig, err)
	}

	pluginDir := filepath.Join(cfg.pluginsDir, cfg.driverName)
	for _, dir := range []string{cfg.registryDir, pluginDir, cfg.cdiDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	d, err := newDriver(cfg, pluginDir, func(err error) {
		select {
		case fatal <- err:
		default:
		}
		cancel()
	})
	if err != nil {
		return err
	}
	logger.Info("checkpoint loaded", "prepared", d.preparedUIDs())
	go d.health.run(ctx, cfg.healthFile, 200*time.Millisecond)

	regSocket := cfg.driverName + "-reg.sock"
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(cfg.driverName),
		kubeletplugin.NodeName(cfg.nodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(cfg.registryDir),
		kubeletplugin.RegistrarSocketFilename(regSocket),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
	)
	if err != nil {
		return fmt.Errorf("start the kubeletplugin helper: %w", err)
	}
	defer helper.Stop()
	if err := helper.PublishResources(ctx, d.resources()); err != nil {
		return fmt.Errorf("publish the ResourceSlice: %w", err)
	}
	fmt.Printf("ready: %s\n", filepath.Join(cfg.registryDir, regSocket))

	<-ctx.Done()
	select {
	case err := <-fatal:
		return err
	default:
		logger.Info("stopping on a signal")
		return nil
	}
}
