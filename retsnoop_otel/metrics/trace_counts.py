"""Traces handed to the exporters, by probe set, the service.name their spans carry and their status.

They say which workloads make the kernel fail, and under which service a trace backend holds their traces:
Jaeger's search needs a service, so the alert rules' trace links (dashboards/alerts.yml, traces_url) read it from
here. Counted in user space per exported trace, so the series are bounded apart from the kernel's: a probe set's
services beyond `max_services` count under `other`.
"""

from __future__ import annotations

import threading

OTHER = "other"
TraceKey = tuple[str, str, str]  # (probe set, service, status: error | ok)


class TraceCounts:
    def __init__(self, max_services: int = 100) -> None:
        self.max_services = max(1, max_services)
        self._counts: dict[TraceKey, int] = {}
        self._services: dict[str, set[str]] = {}
        self._lock = threading.Lock()  # the capture loop adds, the scrape thread reads

    def add(self, probe_set: str, service: str, error: bool) -> None:
        with self._lock:
            known = self._services.setdefault(probe_set, set())
            if service not in known:
                if len(known) >= self.max_services:
                    service = OTHER
                else:
                    known.add(service)
            key = (probe_set, service, "error" if error else "ok")
            self._counts[key] = self._counts.get(key, 0) + 1

    def snapshot(self) -> dict[TraceKey, int]:
        with self._lock:
            return dict(self._counts)
