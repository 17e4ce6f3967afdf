//go:build helper_v1alpha1

package main

import (
	"time"

	"k8s.io/klog/v2"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
)

// Before v0.37 the helper advertises and serves dra-health (v1alpha1 only) when the
// driver itself is a v1alpha1 DRAResourceHealth server; the generated interface wants
// its Unimplemented type embedded.
type healthBase = drahealthv1alpha1.UnimplementedDRAResourceHealthServer

var _ drahealthv1alpha1.DRAResourceHealthServer = &driver{}

// NodeWatchResources streams the health file's devices to the kubelet until the
// stream ends.
func (d *driver) NodeWatchResources(_ *drahealthv1alpha1.NodeWatchResourcesRequest, stream drahealthv1alpha1.DRAResourceHealth_NodeWatchResourcesServer) error {
	ctx := stream.Context()
	logger := klog.FromContext(ctx)
	logger.Info("dra-health v1alpha1 stream opened")
	defer logger.Info("dra-health v1alpha1 stream closed")
	return d.streamHealth(ctx, func(devices []deviceHealth) error {
		resp := &drahealthv1alpha1.NodeWatchResourcesResponse{}
		now := time.Now().Unix()
		for _, dev := range devices {
			resp.Devices = append(resp.Devices, &drahealthv1alpha1.DeviceHealth{
				Device:                    &drahealthv1alpha1.DeviceIdentifier{PoolName: d.node, DeviceName: dev.Device},
				Health:                    v1alpha1Status(dev.Health),
				LastUpdatedTime:           now,
				HealthCheckTimeoutSeconds: int64(d.healthTimeout / time.Second),
				Message:                   dev.Message,
			})
		}
		return stream.Send(resp)
	})
}

func v1alpha1Status(health string) drahealthv1alpha1.HealthStatus {
	switch health {
	case "Healthy":
		return drahealthv1alpha1.HealthStatus_HEALTHY
	case "Unhealthy":
		return drahealthv1alpha1.HealthStatus_UNHEALTHY
	default:
		return drahealthv1alpha1.HealthStatus_UNKNOWN
	}
}
