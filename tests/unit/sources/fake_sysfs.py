"""A fake ``/sys`` tree for PCI tests: devices, AER counter files, link state, driver links."""

from __future__ import annotations

import os
import shutil


class FakeSysfs:
    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(self.base, exist_ok=True)

    @property
    def base(self) -> str:
        return os.path.join(self.root, "bus", "pci", "devices")

    def path(self, address: str) -> str:
        return os.path.join(self.base, address)

    def add(
        self,
        address: str,
        *,
        vendor: str = "0x10de",
        device: str = "0x2330",
        klass: str = "0x030200",
        driver: str | None = "nvidia",
        link: tuple[str, str, str, str] | None = ("16.0 GT/s PCIe", "16.0 GT/s PCIe", "16", "16"),
        aer: bool = True,
    ) -> None:
        p = self.path(address)
        os.makedirs(p, exist_ok=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", klass)):
            self.write(address, name, value)
        if driver:
            target = os.path.join(self.root, "bus", "pci", "drivers", driver)
            os.makedirs(target, exist_ok=True)
            os.symlink(target, os.path.join(p, "driver"))
        if link:
            for name, value in zip(
                ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width"),
                link,
                strict=True,
            ):
                self.write(address, name, value)
        if aer:
            self.aer(address, fatal=0, nonfatal=0, correctable=0)

    def write(self, address: str, name: str, value: str) -> None:
        with open(os.path.join(self.path(address), name), "w") as f:
            f.write(value + "\n")

    def aer(self, address: str, *, fatal: int, nonfatal: int, correctable: int) -> None:
        self.write(address, "aer_dev_fatal", f"Undefined 0\nDLP {fatal}\nTOTAL_ERR_FATAL {fatal}")
        self.write(
            address,
            "aer_dev_nonfatal",
            f"Undefined 0\nCmplTO {nonfatal}\nTOTAL_ERR_NONFATAL {nonfatal}",
        )
        self.write(
            address,
            "aer_dev_correctable",
            f"RxErr {correctable}\nBadTLP 0\nTOTAL_ERR_COR {correctable}",
        )

    def remove(self, address: str) -> None:
        shutil.rmtree(self.path(address))
