# retsnoop-otel agent image.
#
#   docker build -t retsnoop-otel .
#   (behind a proxy that re-signs TLS, pip in the build stage needs its CA bundle:
#    docker build --secret id=pip-ca,src=/etc/ssl/certs/ca-certificates.crt -t retsnoop-otel .)
#   (file:line for kernel and user frames needs llvm-symbolizer, which takes LLVM along (+180 MB):
#    docker build --build-arg SYMBOLIZER=llvm ...)
#   (arm64, from the aarch64 wheel that `make wheel` cross-builds into dist/aarch64, on any host:
#    docker build --platform linux/arm64 --build-arg WHEEL=prebuilt --build-context wheels=dist/aarch64 ...;
#    both architectures as one manifest list: docs/guides/kubernetes.md)
#   docker run --rm --pid=host \
#     --cap-drop=ALL --cap-add=BPF --cap-add=PERFMON --cap-add=SYS_RESOURCE --cap-add=SYSLOG \
#     --ulimit memlock=-1 \
#     -v /sys/kernel/btf:/sys/kernel/btf:ro \
#     -v /sys/kernel/tracing:/sys/kernel/tracing:ro -v /sys/kernel/debug:/sys/kernel/debug:ro \
#     -v /boot:/boot:ro -v /usr/lib/debug:/usr/lib/debug:ro \
#     -e OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 \
#     -p 9464:9464 retsnoop-otel
#   (the baked-in config/agent.yaml sets no endpoint: the environment's is used, else http://localhost:4318;
#    -v "$PWD/agent.yaml:/etc/retsnoop-otel/agent.yaml:ro" replaces the config)
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

# ---- wheels: empty unless the build gives it, as `--build-context wheels=DIR`, with WHEEL=prebuilt ----------------
# The arm64 image is built under emulation (qemu-user) on an x86-64 host, where compiling libbpf and the BPF
# objects with clang takes many times longer than natively; `make wheel` already cross-builds the same sdist for
# aarch64 (dist/aarch64: the wheel, and deps/ with its dependencies as wheels), so that image installs those and
# compiles nothing. DIR holds one retsnoop_otel-*.whl and deps/ (its dependencies as wheels: no index is asked).
# The default (WHEEL=source) builds from this tree, as the x86-64 image does.
FROM scratch AS wheels

# ---- build: our libbpf, the CO-RE BPF objects and the publisher library, in a wheel; then the virtualenv ----------
FROM ${DEBIAN_IMAGE} AS build
# source: compile the wheel here; prebuilt: install the wheels of the build context `wheels` (above)
ARG WHEEL=source
# Debian package versions are not pinned: a stable release only receives security fixes, which a
# rebuild should pick up. A prebuilt wheel needs no compiler.
# hadolint ignore=DL3008,SC2046
RUN case "$WHEEL" in source|prebuilt) ;; *) echo "WHEEL=$WHEEL: use WHEEL=source or WHEEL=prebuilt" >&2; exit 2;; esac \
    && apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \
       $(if [ "$WHEEL" = source ]; then echo clang curl gcc libc6-dev libelf-dev llvm make zlib1g-dev; fi) \
    && rm -rf /var/lib/apt/lists/*
# Bytecode: the runtime never writes any (PYTHONDONTWRITEBYTECODE, and a read-only root in Kubernetes), so every
# module must have its .pyc in the image or each start compiles it again. pip compiles at install, with
# timestamp-checked .pyc files: valid only while each source keeps the mtime and size they recorded, which a tool
# that flattens, copies or converts the image need not keep; every import would then compile its module and read
# its source on every start. compileall --invalidation-mode unchecked-hash writes .pyc files that are valid whatever
# the timestamps: the import reads the .pyc and never the source (Python 3.11 still stats the source to find it).
# The sources cannot change in an image, which is what makes not checking them safe. The package's own modules are
# also written into one bundle (retsnoop_otel/code_bundle.py: one file read instead of a stat and a .pyc per module),
# unchecked too.
# copied, not bind-mounted: buildah's layer cache ignores what a RUN's bind mount holds, and would keep a venv
# made from an older wheel
COPY --from=wheels . /prebuilt/
WORKDIR /src
COPY . .
# hadolint ignore=DL3042
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && python3 -m venv /opt/retsnoop-otel \
    && if [ "$WHEEL" = source ]; then \
         /opt/retsnoop-otel/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
         && /opt/retsnoop-otel/bin/pip install --no-cache-dir /wheels/retsnoop_otel-*.whl; \
       elif ls /prebuilt/retsnoop_otel-*.whl >/dev/null 2>&1; then \
         /opt/retsnoop-otel/bin/pip install --no-cache-dir --no-index --find-links /prebuilt/deps \
           /prebuilt/retsnoop_otel-*.whl; \
       else \
         echo "WHEEL=prebuilt: no retsnoop_otel-*.whl in the build context wheels: pass --build-context wheels=dist/aarch64 (make wheel)" >&2; \
         exit 2; \
       fi \
    && /opt/retsnoop-otel/bin/pip uninstall -y -q setuptools pip \
    && /opt/retsnoop-otel/bin/python -m compileall -q -f -j 0 --invalidation-mode unchecked-hash /opt/retsnoop-otel/lib \
    && /opt/retsnoop-otel/bin/python -c "import os, retsnoop_otel, retsnoop_otel.code_bundle as b; \
         b.write(os.path.dirname(retsnoop_otel.__file__), checked=False)" \
    && /opt/retsnoop-otel/bin/retsnoop-otel --version

# ---- runtime: Python, libelf and zlib (what our libbpf links), and the virtualenv ----------------------------------
FROM ${DEBIAN_IMAGE}
ARG SYMBOLIZER=none
ARG VERSION=0.1.0
# the repository the image is built from (a release build passes its URL)
ARG SOURCE_URL=""
LABEL org.opencontainers.image.title="retsnoop-otel" \
      org.opencontainers.image.description="retsnoop-style kernel function tracing as OpenTelemetry traces and Prometheus metrics" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="BSD-2-Clause AND GPL-2.0-only AND (LGPL-2.1-only OR BSD-2-Clause)"
# procps: kill, for `kubectl exec ... -- kill -HUP 1` (reload); llvm (llvm-symbolizer) only with SYMBOLIZER=llvm
# hadolint ignore=DL3008,SC2046
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 libelf1 zlib1g procps ca-certificates \
       $(if [ "$SYMBOLIZER" = llvm ]; then echo llvm; fi) \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/retsnoop-otel /opt/retsnoop-otel
COPY LICENSE /usr/share/doc/retsnoop-otel/LICENSE
COPY bpf/LICENSE /usr/share/doc/retsnoop-otel/LICENSE.bpf
COPY config/agent.yaml /etc/retsnoop-otel/agent.yaml
ENV PATH=/opt/retsnoop-otel/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
EXPOSE 9464
# follows the config's metrics.port and web config (TLS, basic auth): `retsnoop-otel agent --health`
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s \
    CMD ["/opt/retsnoop-otel/bin/retsnoop-otel", "agent", "--health", "--config", "/etc/retsnoop-otel/agent.yaml"]
# hadolint ignore=DL3002
USER 0:0
ENTRYPOINT ["/opt/retsnoop-otel/bin/retsnoop-otel", "agent"]
CMD ["--config", "/etc/retsnoop-otel/agent.yaml"]
