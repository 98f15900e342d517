"""A session's service: the application's own service.name, the container's name, the executable's name."""

from __future__ import annotations

from retsnoop_otel.capture.model import AppContext, Session, Workload
from retsnoop_otel.export.service_name import UNKNOWN_SERVICE, session_service
from retsnoop_otel.export.span_encoder import WorkloadEnvelopes


def _session(exe: str = "server", comm: str = "server", **kw) -> Session:
    s = Session(tid=1, pid=1, comm="worker-3", proc_comm=comm, start_ns=0, end_ns=1, is_err=True, chain=[], kstack=[],
                **kw)
    s.exe_name = exe
    return s


def test_the_application_names_its_service_first() -> None:
    s = _session(workload=Workload("a" * 64, "containerd", "uid", "pod-1", "shop", "shop-api"))
    s.app = AppContext("ok", service_name="checkout")
    assert session_service(s) == "checkout"


def test_then_the_container_name_then_the_executable() -> None:
    assert session_service(_session(workload=Workload("a" * 64, "containerd", "uid", "pod-1", "shop", "api"))) == "api"
    assert session_service(_session(workload=Workload("a" * 64))) == "server"  # a container without pod metadata
    no_record = _session()
    no_record.app = AppContext("no_record")  # publishes no service name: the executable's
    assert session_service(no_record) == "server"
    assert session_service(_session(exe="", comm="kworker/0:1")) == "kworker/0:1"
    assert session_service(_session(exe="", comm="")) == UNKNOWN_SERVICE


def test_each_workload_and_service_has_its_own_resource() -> None:
    base = {"service.name": "retsnoop-otel", "service.version": "0.1.0", "host.name": "h"}
    envelopes = WorkloadEnvelopes(base)
    assert envelopes.of(None) is envelopes.base and envelopes.of(None, None) is envelopes.base
    host_app, pod_app = envelopes.of(None, "server"), envelopes.of(Workload("b" * 64), "server")
    assert host_app is not pod_app and host_app is envelopes.of(None, "server")
    assert envelopes.of(Workload("b" * 64), "other") is not pod_app
