package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// The health file (--health-file):
//
//	{"devices": {"gpu-0": {"health": "Unhealthy", "message": "XID 79"}}, "silent": false,
//	 "omit": ["gpu-2"], "duplicates": {"gpu-1": {"health": "Unhealthy"}}, "failStream": 0}
//
// A device not named is Healthy with no message, a health other than Healthy,
// Unhealthy or Unknown reads as Unknown; a missing file means all Healthy;
// "silent": true stops all reports (the kubelet's lease then runs out: Unknown).
// Reports leave out the devices in "omit", and carry a second entry for each device
// in "duplicates", after its first. Every change of "failStream" ends the streams
// open at that moment with an error (the kubelet opens a new one).
type healthFile struct {
	Devices    map[string]healthEntry `json:"devices"`
	Silent     bool                   `json:"silent"`
	Omit       []string               `json:"omit"`
	Duplicates map[string]healthEntry `json:"duplicates"`
	FailStream int                    `json:"failStream"`
}

type healthEntry struct {
	Health  string `json:"health"`
	Message string `json:"message"`
}

// deviceHealth is one device's health, independent of any dra-health API version.
type deviceHealth struct {
	Device  string
	Health  string // Healthy, Unhealthy or Unknown
	Message string
}

type healthSnapshot struct {
	silent     bool
	failStream int
	devices    []deviceHealth
}

// healthMonitor holds the health read last from the file and tells the streams when
// it changes.
type healthMonitor struct {
	names []string

	mu      sync.Mutex
	snap    healthSnapshot
	changed chan struct{} // closed (and replaced) on every change
	raw     []byte        // the file's content behind snap (nil: no file)
	bad     []byte        // content that did not parse, logged once
}

func newHealthMonitor(names []string) *healthMonitor {
	m := &healthMonitor{names: names, changed: make(chan struct{})}
	m.snap = m.parse(healthFile{})
	return m
}

// current returns the snapshot and a channel closed at the next change.
func (m *healthMonitor) current() (healthSnapshot, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.snap, m.changed
}

func (m *healthMonitor) parse(f healthFile) healthSnapshot {
	snap := healthSnapshot{silent: f.Silent, failStream: f.FailStream}
	omitted := map[string]bool{}
	for _, name := range f.Omit {
		omitted[name] = true
	}
	for _, name := range m.names {
		if omitted[name] {
			continue
		}
		h := deviceHealth{Device: name, Health: "Healthy"}
		if entry, ok := f.Devices[name]; ok {
			h = entry.health(name)
		}
		snap.devices = append(snap.devices, h)
		if dup, ok := f.Duplicates[name]; ok {
			snap.devices = append(snap.devices, dup.health(name))
		}
	}
	return snap
}

func (e healthEntry) health(name string) deviceHealth {
	h := deviceHealth{Device: name, Health: "Healthy", Message: e.Message}
	switch e.Health {
	case "Healthy", "Unhealthy", "Unknown":
		h.Health = e.Health
	case "":
	default:
		h.Health = "Unknown"
	}
	return h
}

// run re-reads path every interval until ctx ends.
func (m *healthMonitor) run(ctx context.Context, path string, every time.Duration) {
	logger := klog.FromContext(ctx)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		m.load(logger, path)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (m *healthMonitor) load(logger klog.Logger, path string) {
	raw, err := os.ReadFile(path)
	var f healthFile
	switch {
	case errors.Is(err, fs.ErrNotExist):
		raw = nil
	case err != nil:
		logger.Error(err, "cannot read the health file, keeping the last health", "path", path)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if (raw == nil) == (m.raw == nil) && bytes.Equal(raw, m.raw) {
		return
	}
	if raw != nil {
		if err := json.Unmarshal(raw, &f); err != nil {
			if !bytes.Equal(raw, m.bad) {
				m.bad = raw
				logger.Error(err, "the health file is not valid, keeping the last health", "path", path)
			}
			return
		}
	}
	m.raw = raw
	snap := m.parse(f)
	if reflect.DeepEqual(snap, m.snap) {
		return
	}
	m.snap = snap
	close(m.changed)
	m.changed = make(chan struct{})
	logger.Info("device health changed", "silent", snap.silent, "devices", fmt.Sprintf("%+v", snap.devices))
}

// streamHealth calls send with every device's health at once, whenever the health
// file changes and every third of the health timeout in between (the kubelet's lease
// on each report), nothing while the file says silent. It returns nil when ctx ends,
// or send's error.
func (d *driver) streamHealth(ctx context.Context, send func([]deviceHealth) error) error {
	tick := time.NewTicker(d.healthTimeout / 3)
	defer tick.Stop()
	first, _ := d.health.current()
	for {
		snap, changed := d.health.current()
		if snap.failStream != first.failStream {
			return fmt.Errorf("the health file asked this stream to fail (failStream %d)", snap.failStream)
		}
		if !snap.silent {
			if err := send(snap.devices); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-tick.C:
		}
	}
}
