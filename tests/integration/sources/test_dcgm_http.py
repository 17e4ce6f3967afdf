"""DcgmExporterSource over real HTTP against the fake dcgm-exporter: faults written into
the endpoint, recovery, and every way a scrape can fail (status, refused, slow, oversized,
malformed bytes) raising a clear error instead of reading Healthy."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from drahealth.core import Health, Signal
from drahealth.simdriver import FakeDcgmExporter, FakeDcgmGpu, sim_nvidia_gpus
from drahealth.sources import DcgmExporterSource, DcgmScrapeError

H, U = Health.HEALTHY, Health.UNHEALTHY
G0, G1 = "GPU-5a1b0c2d-0000-4000-8000-000000000000", "GPU-5a1b0c2d-0000-4000-8000-000000000001"


@pytest.fixture
def fake() -> Iterator[FakeDcgmExporter]:
    gpus = [FakeDcgmGpu(0, G0, "00000000:3B:00.0"), FakeDcgmGpu(1, G1, "00000000:86:00.0")]
    with FakeDcgmExporter(gpus, hostname="gpu-node-1") as exporter:
        yield exporter


def by_value(signals: list[Signal]) -> dict[str, Signal]:
    return {s.value: s for s in signals}


def test_a_fault_written_into_the_exporter_and_its_recovery(fake: FakeDcgmExporter) -> None:
    src = DcgmExporterSource(fake.url)
    assert {(s.value, s.health) for s in src.poll()} == {(G0, H), (G1, H)}
    fake.xid(G1, 79)
    got = by_value(src.poll())
    assert got[G1] == Signal("uuid", G1, U, "XID 79: GPU has fallen off the bus (reset the GPU)")
    assert got[G0].health is H
    fake.clear(G1)  # DCGM restarted after the GPU reset
    assert by_value(src.poll())[G1].health is H
    assert (src.scrapes, src.scrape_errors, fake.requests) == (3, 0, 3)


def test_the_xid_window_collector(fake: FakeDcgmExporter) -> None:
    fake.xid_window_ms = 300000
    src = DcgmExporterSource(fake.url, key="pci")
    fake.xid(G0, 94)
    fake.xid(G0, 94)
    got = {s.value: s for s in src.poll()}
    assert got["00000000:3B:00.0"].message == (
        "XID 94: contained ECC error (reset the GPU), 2 time(s) in the last 5 min"
    )


def test_the_demo_can_serve_the_simulated_nvidia_gpus() -> None:
    gpus = sim_nvidia_gpus("node-1", 8)
    with FakeDcgmExporter.from_gpus(gpus, hostname="node-1") as exporter:
        exporter.xid(gpus[3].uuid, 79)
        src = DcgmExporterSource(exporter.url, key="pci")
        unhealthy = [s.value for s in src.poll() if s.health is U]
    assert [v.lower() for v in unhealthy] == [f"0000{gpus[3].pci_bus_id}"]


@pytest.mark.parametrize("status", [503, 404, 302])
def test_an_http_error_raises_and_is_counted(fake: FakeDcgmExporter, status: int) -> None:
    src = DcgmExporterSource(fake.url)
    fake.fail(status)
    with pytest.raises(DcgmScrapeError, match=f"HTTP {status}"):
        src.poll()
    assert src.scrape_errors == 1 and src.last_error.endswith(f"HTTP {status}")
    fake.fail(None)
    assert len(src.poll()) == 2 and src.last_error == ""


def test_a_wrong_path_is_an_error(fake: FakeDcgmExporter) -> None:
    src = DcgmExporterSource(fake.url.replace("/metrics", "/nope"))
    with pytest.raises(DcgmScrapeError, match="HTTP 404"):
        src.poll()


def test_a_stopped_exporter_raises() -> None:
    exporter = FakeDcgmExporter([FakeDcgmGpu(0, G0, "00000000:3B:00.0")]).start()
    url = exporter.url
    exporter.stop()
    with pytest.raises(DcgmScrapeError, match=r"dcgm-exporter http://127\.0\.0\.1"):
        DcgmExporterSource(url, scrape_timeout=2).poll()


def test_a_slow_exporter_times_out(fake: FakeDcgmExporter) -> None:
    fake.delay = 3.0
    with pytest.raises(DcgmScrapeError, match="timed out"):
        DcgmExporterSource(fake.url, scrape_timeout=0.3).poll()


def test_an_oversized_response_is_refused(fake: FakeDcgmExporter) -> None:
    src = DcgmExporterSource(fake.url, max_bytes=4096)
    with pytest.raises(DcgmScrapeError, match="response over 4096 bytes"):
        src.poll()


def test_malformed_bytes_are_skipped_and_counted(fake: FakeDcgmExporter) -> None:
    good = fake.render().encode()
    junk = (
        b'DCGM_FI_DEV_XID_ERRORS{UUID="GPU-\xff\xfe"} 79\n'  # invalid UTF-8 in a label
        b'DCGM_FI_DEV_GPU_TEMP{UUID="' + G0.encode() + b'" 99\n'  # unterminated labels
        b'DCGM_FI_DEV_ROW_REMAP_FAILURE{UUID="' + G1.encode() + b'"} \xc3\x28\n'  # bad value
        b"\x00\x01\x02 binary noise\n"
    )
    fake.set_body(good + junk)
    src = DcgmExporterSource(fake.url)
    got = by_value(src.poll())
    assert got[G0].health is H and got[G1].health is H
    assert src.malformed_lines == 2
    assert got["GPU-\ufffd\ufffd"].health is U  # the replaced key matches no device
    fake.set_body(b"\xff" * 100)
    with pytest.raises(DcgmScrapeError, match="no GPU in the scrape"):
        src.poll()


def test_a_trickling_exporter_hits_the_deadline_for_the_whole_response() -> None:
    """One byte at a time, each well within the socket timeout: the scrape still ends."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
            while not stop.wait(0.05):
                try:
                    conn.sendall(b"#")
                except OSError:
                    return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        src = DcgmExporterSource(f"http://127.0.0.1:{port}/metrics", scrape_timeout=0.5)
        with pytest.raises(DcgmScrapeError, match=r"no complete response in 0\.5 s"):
            src.poll()
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=5)
