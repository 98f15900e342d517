# retsnoop-otel agent image.
#
#   docker build -t retsnoop-otel .
#   docker run --rm --pid=host \
#     --cap-drop=ALL --cap-add=BPF --cap-add=PERFMON --cap-add=SYS_RESOURCE --cap-add=SYSLOG \
#     --ulimit memlock=-1 \
#     -v /sys/kernel/btf:/sys/kernel/btf:ro \
#     -v /sys/kernel/tracing:/sys/kernel/tracing:ro -v /sys/kernel/debug:/sys/kernel/debug:ro \
#     -v /boot:/boot:ro -v /usr/lib/debug:/usr/lib/debug:ro \
#     -v "$PWD/agent.yaml:/etc/retsnoop-otel/agent.yaml:ro" \
#     -p 9464:9464 retsnoop-otel
#
# Privileges, and why each one is needed:
#   CAP_BPF            load the BPF programs and create their maps
#   CAP_PERFMON        attach fentry/fexit, kprobes and kprobe_multi; read kernel stacks
#   CAP_SYS_RESOURCE   (or --ulimit memlock=-1) only on kernels older than 5.11, which charge BPF maps
#                      to RLIMIT_MEMLOCK; newer kernels use memory cgroups instead
#   CAP_SYSLOG         real addresses in /proc/kallsyms (without it they read as zeros)
#   Kernels older than 5.8 have no CAP_BPF/CAP_PERFMON: use CAP_SYS_ADMIN there.
# Mounts (read-only is enough):
#   /sys/kernel/btf                    kernel BTF: CO-RE relocations, fentry targets, return types
#   /sys/kernel/tracing (or /sys/kernel/debug/tracing)   available_filter_functions
#   /boot, /usr/lib/debug              a vmlinux with DWARF, only for `vmlinux:` (file:line, ':path' globs)
# --pid=host (hostPID in Kubernetes): process ids and names in traces are the host's, and pid filters
# in the config refer to host pids.
# The process runs as uid 0 on purpose: Linux capabilities are only effective for a non-root user
# through ambient or file capabilities, which container runtimes (and Kubernetes) do not grant;
# the capability set above, not the uid, is what limits it.

ARG DEBIAN_IMAGE=debian:bookworm-slim

# ---- build: compile the CO-RE BPF object and install the package into a virtualenv ----------------
FROM ${DEBIAN_IMAGE} AS build
# Debian package versions are not pinned: a stable release only receives security fixes, which a
# rebuild should pick up.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends clang llvm libbpf-dev make python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY bpf ./bpf
COPY retsnoop_otel ./retsnoop_otel
RUN python3 -m venv /opt/retsnoop-otel \
    && /opt/retsnoop-otel/bin/pip install --no-cache-dir ".[kubernetes]" \
    && test -f "$(/opt/retsnoop-otel/bin/python -c 'import retsnoop_otel, os; print(os.path.dirname(retsnoop_otel.__file__))')/bpf/retsnoop.bpf.o"

# ---- runtime: python, libbpf and llvm-symbolizer only ------------------------------------------
FROM ${DEBIAN_IMAGE}
LABEL org.opencontainers.image.title="retsnoop-otel" \
      org.opencontainers.image.description="retsnoop-style kernel function tracing as OpenTelemetry traces and Prometheus metrics"
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 libbpf1 llvm ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/retsnoop-otel /opt/retsnoop-otel
COPY config/agent.yaml /etc/retsnoop-otel/agent.yaml
ENV PATH=/opt/retsnoop-otel/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
EXPOSE 9464
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s \
    CMD ["/opt/retsnoop-otel/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=5)"]
# hadolint ignore=DL3002
USER 0:0
ENTRYPOINT ["/opt/retsnoop-otel/bin/retsnoop-otel", "agent"]
CMD ["--config", "/etc/retsnoop-otel/agent.yaml"]
