//go:build !helper_v1alpha1

package main

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

// From v0.37 the helper serves dra-health v1 and v1alpha1 itself, calling the
// driver's version-neutral WatchHealthStatus: nothing to embed.
type healthBase struct{}

// WatchHealthStatus streams the health file's devices to the kubelet until the
// stream ends.
func (d *driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	version := streamVersion(ctx)
	logger := klog.FromContext(ctx)
	logger.Info("dra-health " + version + " stream opened")
	defer logger.Info("dra-health " + version + " stream closed")
	return d.streamHealth(ctx, func(devices []deviceHealth) error {
		report := kubeletplugin.DeviceHealthReport{Devices: make([]kubeletplugin.DeviceHealth, 0, len(devices))}
		now := time.Now()
		for _, dev := range devices {
			report.Devices = append(report.Devices, kubeletplugin.DeviceHealth{
				PoolName:           d.node,
				DeviceName:         dev.Device,
				Health:             kubeletplugin.HealthStatus(dev.Health),
				LastUpdated:        now,
				HealthCheckTimeout: d.healthTimeout,
				Message:            dev.Message,
			})
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case reports <- report:
			return nil
		}
	})
}

// streamVersion is the dra-health version the kubelet subscribed on. The helper's API
// hides it; the gRPC method of the stream (its context is the one the helper passes
// on) names it: "/v1.DRAResourceHealth/NodeWatchResources".
func streamVersion(ctx context.Context) string {
	method, ok := grpc.Method(ctx)
	if !ok {
		return "(version unknown)"
	}
	service, _, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	version, _, _ := strings.Cut(service, ".")
	return version
}
