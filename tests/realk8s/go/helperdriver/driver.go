package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// checkpointName is the file in the driver's plugin directory that lists the claims it
// holds prepared.
const checkpointName = "checkpoint.json"

// preparedDevice is one device of a prepared claim, as returned to the kubelet.
type preparedDevice struct {
	Requests     []string `json:"requests"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
}

type preparedClaim struct {
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	Devices   []preparedDevice `json:"devices"`
}

type checkpoint struct {
	Claims map[types.UID]preparedClaim `json:"claims"`
}

// driver implements kubeletplugin.DRAPlugin; healthBase adds what the release's helper
// needs to serve device health (health_v1.go, health_v1alpha1.go).
type driver struct {
	healthBase

	name          string
	node          string
	devices       []string
	pluginDir     string
	cdiDir        string
	healthTimeout time.Duration
	health        *healthMonitor
	fatal         func(error)

	mu       sync.Mutex // prepared and the files written from it
	prepared checkpoint
}

func newDriver(cfg config, pluginDir string, fatal func(error)) (*driver, error) {
	d := &driver{
		name:          cfg.driverName,
		node:          cfg.nodeName,
		pluginDir:     pluginDir,
		cdiDir:        cfg.cdiDir,
		healthTimeout: time.Duration(cfg.healthTimeout) * time.Second,
		fatal:         fatal,
		prepared:      checkpoint{Claims: map[types.UID]preparedClaim{}},
	}
	for i := range cfg.devices {
		d.devices = append(d.devices, fmt.Sprintf("gpu-%d", i))
	}
	d.health = newHealthMonitor(d.devices)
	data, err := os.ReadFile(d.checkpointPath())
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read the checkpoint: %w", err)
	default:
		if err := json.Unmarshal(data, &d.prepared); err != nil {
			return nil, fmt.Errorf("checkpoint %s is not valid JSON: %w", d.checkpointPath(), err)
		}
		if d.prepared.Claims == nil {
			d.prepared.Claims = map[types.UID]preparedClaim{}
		}
	}
	return d, nil
}

func (d *driver) checkpointPath() string { return filepath.Join(d.pluginDir, checkpointName) }

// cdiSpecPath is the claim's CDI spec file.
func (d *driver) cdiSpecPath(uid types.UID) string {
	return filepath.Join(d.cdiDir, fmt.Sprintf("%s-claim_%s.json", d.name, uid))
}

// cdiKind is the vendor/class of the CDI devices; an id is "<kind>=<claim uid>-<device>".
func (d *driver) cdiKind() string { return "k8s." + d.name + "/claim" }

// resources is the one pool (named after the node) with all devices in one slice.
func (d *driver) resources() resourceslice.DriverResources {
	devices := make([]resourceapi.Device, 0, len(d.devices))
	for i, name := range d.devices {
		index := int64(i)
		devices = append(devices, resourceapi.Device{
			Name: name,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"index": {IntValue: &index},
			},
		})
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			d.node: {Slices: []resourceslice.Slice{{Devices: devices}}},
		},
	}
}

func (d *driver) knownDevice(name string) bool {
	for _, n := range d.devices {
		if n == name {
			return true
		}
	}
	return false
}

// PrepareResourceClaims writes a CDI spec per claim and records the claim in the
// checkpoint. A claim prepared already gets what it got the first time.
func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	logger := klog.FromContext(ctx)
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		devices, err := d.prepareClaim(claim)
		if err != nil {
			logger.Error(err, "prepare failed", "claim", klog.KObj(claim), "uid", claim.UID)
			result[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		logger.Info("prepared", "claim", klog.KObj(claim), "uid", claim.UID, "devices", len(devices))
		out := make([]kubeletplugin.Device, 0, len(devices))
		for _, dev := range devices {
			out = append(out, kubeletplugin.Device{
				Requests: dev.Requests, PoolName: dev.Pool, DeviceName: dev.Device,
				CDIDeviceIDs: dev.CDIDeviceIDs,
			})
		}
		result[claim.UID] = kubeletplugin.PrepareResult{Devices: out}
	}
	return result, nil
}

func (d *driver) prepareClaim(claim *resourceapi.ResourceClaim) ([]preparedDevice, error) {
	if done, ok := d.prepared.Claims[claim.UID]; ok {
		return done.Devices, nil
	}
	if claim.Status.Allocation == nil {
		return nil, errors.New("the claim is not allocated")
	}
	inUse := map[string]types.UID{}
	for uid, c := range d.prepared.Claims {
		for _, dev := range c.Devices {
			inUse[dev.Device] = uid
		}
	}
	var devices []preparedDevice
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.name {
			continue
		}
		if r.Pool != d.node || !d.knownDevice(r.Device) {
			return nil, fmt.Errorf("allocated device %s/%s is not one of this driver's", r.Pool, r.Device)
		}
		if other, taken := inUse[r.Device]; taken && (r.AdminAccess == nil || !*r.AdminAccess) {
			return nil, fmt.Errorf("device %s is prepared for claim %s already", r.Device, other)
		}
		devices = append(devices, preparedDevice{
			Requests:     []string{r.Request},
			Pool:         r.Pool,
			Device:       r.Device,
			CDIDeviceIDs: []string{fmt.Sprintf("%s=%s-%s", d.cdiKind(), claim.UID, r.Device)},
		})
	}
	// the spec first, then the checkpoint: the checkpoint never names a claim whose
	// spec is missing, and a spec without a checkpoint entry is rewritten on retry
	if err := d.writeCDISpec(claim.UID, devices); err != nil {
		return nil, fmt.Errorf("write the CDI spec: %w", err)
	}
	d.prepared.Claims[claim.UID] = preparedClaim{Namespace: claim.Namespace, Name: claim.Name, Devices: devices}
	if err := d.saveCheckpoint(); err != nil {
		delete(d.prepared.Claims, claim.UID)
		_ = removeDurably(d.cdiSpecPath(claim.UID))
		return nil, fmt.Errorf("write the checkpoint: %w", err)
	}
	return devices, nil
}

// writeCDISpec writes the claim's CDI spec: one CDI device per allocated device, each
// setting an environment variable that names it.
func (d *driver) writeCDISpec(uid types.UID, devices []preparedDevice) error {
	type edits struct {
		Env []string `json:"env"`
	}
	type cdiDevice struct {
		Name           string `json:"name"`
		ContainerEdits edits  `json:"containerEdits"`
	}
	spec := struct {
		CDIVersion string      `json:"cdiVersion"`
		Kind       string      `json:"kind"`
		Devices    []cdiDevice `json:"devices"`
	}{CDIVersion: "0.6.0", Kind: d.cdiKind(), Devices: []cdiDevice{}}
	for i, dev := range devices {
		spec.Devices = append(spec.Devices, cdiDevice{
			Name:           fmt.Sprintf("%s-%s", uid, dev.Device),
			ContainerEdits: edits{Env: []string{fmt.Sprintf("HELPERDRIVER_DEVICE_%d=%s", i, dev.Device)}},
		})
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	return writeDurably(d.cdiSpecPath(uid), append(data, '\n'))
}

func (d *driver) saveCheckpoint() error {
	data, err := json.MarshalIndent(d.prepared, "", "  ")
	if err != nil {
		return err
	}
	return writeDurably(d.checkpointPath(), append(data, '\n'))
}

// UnprepareResourceClaims removes each claim's CDI spec and its checkpoint entry; a
// claim not prepared (or unprepared already) is fine.
func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	logger := klog.FromContext(ctx)
	result := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		err := d.unprepareClaim(claim.UID)
		if err != nil {
			logger.Error(err, "unprepare failed", "claim", claim.NamespacedName, "uid", claim.UID)
		} else {
			logger.Info("unprepared", "claim", claim.NamespacedName, "uid", claim.UID)
		}
		result[claim.UID] = err
	}
	return result, nil
}

func (d *driver) unprepareClaim(uid types.UID) error {
	// the spec first: until the checkpoint entry is gone a retry removes it again
	if err := removeDurably(d.cdiSpecPath(uid)); err != nil {
		return fmt.Errorf("remove the CDI spec: %w", err)
	}
	held, ok := d.prepared.Claims[uid]
	if !ok {
		return nil
	}
	delete(d.prepared.Claims, uid)
	if err := d.saveCheckpoint(); err != nil {
		d.prepared.Claims[uid] = held
		return fmt.Errorf("write the checkpoint: %w", err)
	}
	return nil
}

// HandleError logs a background error of the helper; one that is not recoverable
// stops the driver (the process exits 1).
func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	utilruntime.HandleErrorWithContext(ctx, err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		klog.FromContext(ctx).Error(err, "fatal error, exiting", "context", msg)
		d.fatal(fmt.Errorf("%s: %w", msg, err))
	}
}

// preparedUIDs is for logs: the claims held prepared, sorted.
func (d *driver) preparedUIDs() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.prepared.Claims))
	for uid := range d.prepared.Claims {
		out = append(out, string(uid))
	}
	sort.Strings(out)
	return out
}
