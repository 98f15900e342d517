# Entry points: `make demo` and `make test` work on a fresh Debian 12 machine (root or sudo).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LOW_VENV := .venv-lowest
LOW_STAMP := $(LOW_VENV)/.installed
# podman, mmdebstrap, runc: tests/test_image.py builds and runs the container image; qemu-system-arm,
# qemu-user-static, binfmt-support, arch-test, gcc-aarch64-linux-gnu: the aarch64 wheel and the arm64 VM;
# prometheus, prometheus-alertmanager: the real backends of the alert tests (Jaeger is built from Go, below)
APT_PACKAGES := clang llvm libelf-dev zlib1g-dev curl bpftool qemu-system-x86 kmod busybox-static prometheus \
	prometheus-alertmanager podman mmdebstrap runc time qemu-system-arm qemu-user-static binfmt-support arch-test \
	gcc-aarch64-linux-gnu
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
PYTEST_ARGS ?= -ra

.NOTPARALLEL:
.PHONY: setup apt binfmt bpf jaeger helm wheel docs kernels test unit vmtest lowest lint demo clean distclean

## setup: Debian packages (only missing ones), qemu-aarch64 in binfmt_misc (the arm64 image and root), .venv with
## the project and its dev and service extras, BPF objects, Jaeger (the trace backend of the demo and the tests) and
## helm (lint and render of the chart in tests/test_helm_chart.py), both built with Go and cached
setup:
	@$(MAKE) --no-print-directory apt
	@$(MAKE) --no-print-directory binfmt
	@$(MAKE) --no-print-directory $(STAMP)
	@$(MAKE) --no-print-directory bpf
	@$(MAKE) --no-print-directory jaeger
	@$(MAKE) --no-print-directory helm

## jaeger: Jaeger v2 pinned at v1.75.0 (tests/peers/jaeger/go.mod), built into the cache outside the repo
jaeger:
	@tests/peers/build-jaeger >/dev/null

## helm: Helm pinned at v4.3.2 (helm.sh/helm/v4 from the Go module proxy), built into the cache outside the repo
helm:
	@tests/peers/build-helm >/dev/null

apt:
	@missing=$$(for p in $(APT_PACKAGES); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed$$' || echo $$p; \
	  done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  $(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; \
	fi

# arm64 programs through qemu-user-static, registered with binfmt_misc with the F flag (its interpreter then works in
# containers: the arm64 image's RUN steps; and in mmdebstrap's arm64 roots); idempotent
binfmt:
	@$(SUDO) tests/binfmt-arm64

$(PY):
	$(PYTHON) -m venv $(VENV)

# editable as a path entry (compat): setuptools' default puts an import finder in a .pth, which every start of this
# venv's Python imports with pathlib, urllib.parse and ipaddress (0.5 s of `python -c pass` under TCG, 0.1 s of a
# `trace` start); the wheel's and the image's users have no such finder, so neither do the VM's runs and benches
EDITABLE := --config-settings editable_mode=compat -e

$(STAMP): pyproject.toml setup.py | $(PY)
	$(PY) -m pip install $(EDITABLE) '.[dev,service,docs]'
	touch $@

# the lowest versions pyproject.toml allows, pinned from its own `>=` bounds so that they cannot drift
$(LOW_STAMP): pyproject.toml setup.py tests/lowest_constraints.py | $(PY)
	$(PYTHON) -m venv $(LOW_VENV)
	$(PY) tests/lowest_constraints.py > $(LOW_VENV)/constraints.txt
	$(LOW_VENV)/bin/python -m pip install -c $(LOW_VENV)/constraints.txt $(EDITABLE) '.[dev]'
	touch $@

# The machine code is built for MACHINE (uname -m's names: x86_64, aarch64), by default this one's. Another
# MACHINE is a cross build, made from the sdist into a wheel (`make wheel-arm64`): the cross compiler
# (gcc-aarch64-linux-gnu) with SYSROOT, a Debian root of that architecture (tests/vm/arm64-root makes one).
MACHINE ?= $(shell uname -m)
SYSROOT ?=
ifeq ($(MACHINE),$(shell uname -m))
TARGET_CC := gcc
TARGET_STRIP := strip
else
TARGET_CC := $(MACHINE)-linux-gnu-gcc$(if $(SYSROOT), --sysroot=$(SYSROOT))
TARGET_STRIP := $(MACHINE)-linux-gnu-strip
endif
BPF_ARCH := $(if $(filter aarch64,$(MACHINE)),arm64,$(if $(filter x86_64,$(MACHINE)),x86,$(MACHINE)))

# our own libbpf (bpf/build-libbpf pins it), loaded by the package whatever the host has; the BPF objects
# compile against its headers
LIBBPF_SO := retsnoop_otel/bpf/libbpf.so.1
LIBBPF_BUILD := build/libbpf-$(MACHINE)
bpf: $(LIBBPF_SO)
	@$(MAKE) --no-print-directory -s -C bpf OUT=$(CURDIR)/retsnoop_otel/bpf LIBBPF_INCLUDE=$(CURDIR)/$(LIBBPF_BUILD)/include \
	  BPF_ARCH=$(BPF_ARCH)
$(LIBBPF_SO): bpf/build-libbpf
	CC="$(firstword $(TARGET_CC))" STRIP=$(TARGET_STRIP) SYSROOT=$(SYSROOT) \
	  bpf/build-libbpf $(CURDIR)/$(LIBBPF_BUILD) $(CURDIR)/retsnoop_otel/bpf

# the parsers of kallsyms and the vmlinux BTF (retsnoop_otel/symbols/kernel_tables.py loads it)
TABLES_SO := retsnoop_otel/symbols/libkernel_tables.so
bpf: $(TABLES_SO)
$(TABLES_SO): retsnoop_otel/symbols/kernel_tables.c
	@$(TARGET_CC) -O2 -fPIC -shared -fvisibility=default -Wall -Wextra -Werror -o $@ $<

# libbpf's print hook with its debug messages dropped in C (retsnoop_otel/kernel/libbpf_abi.py loads it)
PRINT_SO := retsnoop_otel/kernel/libprint_filter.so
bpf: $(PRINT_SO)
$(PRINT_SO): retsnoop_otel/kernel/print_filter.c
	@$(TARGET_CC) -O2 -fPIC -shared -fvisibility=default -Wall -Wextra -Werror -o $@ $<

# the thread-context publisher for Python services (retsnoop_otel/publisher): TLSDESC, only its API exported
PUBLISHER_SO := retsnoop_otel/publisher/libotel_thread_ctx.so
bpf: $(PUBLISHER_SO)
$(PUBLISHER_SO): retsnoop_otel/publisher/otel_thread_ctx.c
	@$(TARGET_CC) -O2 -fPIC -shared -fvisibility=hidden -mtls-dialect=$(if $(filter x86_64,$(MACHINE)),gnu2,desc) \
	  -Wall -Werror -o $@ $<

## wheel: dist/ with the sdist and the wheel built from it, tagged manylinux for the glibc its machine code needs
## (auditwheel takes libelf in; `pip install dist/*.whl` then needs no compiler), and dist/deps with the wheels
## it depends on (an install without an index; the VM test installs from there)
wheel: setup
	rm -rf dist build/wheel
	$(PY) -m build --sdist -o dist .
	$(PY) -m pip wheel --no-cache-dir --no-deps -w build/wheel dist/retsnoop_otel-*.tar.gz
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/auditwheel repair -w dist build/wheel/*.whl
	rm -rf build/wheel
	@# its dependencies as wheels, for installs without an index (tests/vm/scenarios/wheel_install.py)
	$(PY) -m pip download -q --only-binary :all: -d dist/deps dist/retsnoop_otel-*-manylinux_*.whl
	rm -f dist/deps/retsnoop_otel-*
	@# the aarch64 wheel, cross-built from the same sdist against tests/vm/arm64-root's Debian 12 root (its sysroot), in
	@# dist/aarch64 with its dependencies, installed into build/arm64-site for the arm64 VM (tests/vm/run --kernel
	@# 7.2-arm64) with the Python of that root
	rm -rf build/wheel-aarch64 build/arm64-site
	root=$$(tests/vm/arm64-root) && \
	  MACHINE=aarch64 SYSROOT=$$root $(PY) -m pip wheel -q --no-cache-dir --no-deps -w build/wheel-aarch64 \
	    dist/retsnoop_otel-*.tar.gz && \
	  PATH=$(CURDIR)/$(VENV)/bin:$$PATH LD_LIBRARY_PATH=$$root/usr/lib/aarch64-linux-gnu \
	    $(VENV)/bin/auditwheel repair -w dist/aarch64 build/wheel-aarch64/*.whl
	rm -rf build/wheel-aarch64
	$(PY) -m pip download -q $(AARCH64_PIP) -d dist/aarch64/deps dist/aarch64/retsnoop_otel-*.whl
	rm -f dist/aarch64/deps/retsnoop_otel-*
	$(PY) -m pip install -q --no-index --find-links dist/aarch64/deps $(AARCH64_PIP) --target build/arm64-site \
	  dist/aarch64/retsnoop_otel-*.whl

# the Python of tests/vm/arm64-root's Debian 12 root, and the platforms its pip would accept
ARM64_PYTHON := 3.11
AARCH64_PIP := --only-binary :all: --python-version $(ARM64_PYTHON) --implementation cp \
	$(foreach v,36 35 34 31 28 27 26 24 17,--platform manylinux_2_$(v)_aarch64) --platform manylinux2014_aarch64

## kernels: the pinned Debian kernels of the VM tests (tests/vm/kernels.pins: 5.10, 6.1 with its DWARF vmlinux,
## 6.12 and the newest), cached outside the repo; `tests/vm/fetch-kernel --update-pins` moves the pins
kernels: setup
	@for s in $$(tests/vm/fetch-kernel --list); do tests/vm/fetch-kernel $$s >/dev/null || exit 1; done
	tests/vm/fetch-kernel 6.1 --dbg
	@# index the 6.1 DWARF once on the host (cached by build-id): ':path' globs then start fast in the guest
	$(PY) -m retsnoop_otel.symbols.dwarf index "$$(tests/vm/fetch-kernel 6.1 --dbg)"/usr/lib/debug/boot/vmlinux-*

## test: lint, then every test: the VM scenarios on 5.10, 6.1, 6.12, the newest and arm64 in the foreground and, beside
## them, the host tests (unit, native uprobes, artifacts), then those again with the lowest allowed library versions.
## The emulated guests keep about one of two cores busy: the host tests fill the other (their output follows the VM
## tests'; in $(TEST_LOGS) while they run).
## The VM tests' progress lines carry the time since make began (+M:SS): CI keeps only the output's tail.
TEST_LOGS := build/test-logs
ifndef TEST_T0  # once, for sub-makes too
TEST_T0 := $(shell date +%s)
export TEST_T0
endif
test: setup kernels lint wheel
	@echo "make test: setup, kernels, lint and wheel took $$(( $$(date +%s) - $(TEST_T0) )) s"; \
	export RETSNOOP_OTEL_TEST_T0=$(TEST_T0); \
	mkdir -p $(TEST_LOGS); rm -f $(TEST_LOGS)/*; \
	( $(PY) -m pytest -m 'not vm' -p no:cacheprovider $(PYTEST_ARGS) >$(TEST_LOGS)/host.log 2>&1; echo $$? >$(TEST_LOGS)/host.rc; \
	  echo "+$$(( $$(date +%s) - $(TEST_T0) )) s" >$(TEST_LOGS)/host.end; \
	  $(MAKE) --no-print-directory lowest PYTEST_ARGS='-p no:cacheprovider $(PYTEST_ARGS)' >$(TEST_LOGS)/lowest.log 2>&1; \
	  echo $$? >$(TEST_LOGS)/lowest.rc; echo "+$$(( $$(date +%s) - $(TEST_T0) )) s" >$(TEST_LOGS)/lowest.end ) & \
	echo "host tests running beside the VM tests: $(TEST_LOGS)/host.log, then $(TEST_LOGS)/lowest.log"; \
	$(PY) -m pytest -m vm $(PYTEST_ARGS); vm=$$?; vm_end=$$(( $$(date +%s) - $(TEST_T0) )); wait; \
	echo "=== host tests ($(TEST_LOGS)/host.log)"; cat $(TEST_LOGS)/host.log; \
	echo "=== host tests, lowest library versions ($(TEST_LOGS)/lowest.log)"; cat $(TEST_LOGS)/lowest.log; \
	host=$$(cat $(TEST_LOGS)/host.rc); lowest=$$(cat $(TEST_LOGS)/lowest.rc); \
	ended="VM tests +$$vm_end s, host tests $$(cat $(TEST_LOGS)/host.end), lowest $$(cat $(TEST_LOGS)/lowest.end)"; \
	echo "make test: VM tests exit $$vm, host tests exit $$host, lowest versions exit $$lowest ($$ended; in all" \
	  "$$(( $$(date +%s) - $(TEST_T0) )) s)"; \
	[ $$vm = 0 ] && [ $$host = 0 ] && [ $$lowest = 0 ]

## lowest: the host tests in a venv holding the lowest versions pyproject.toml allows (OTel, protobuf, grpcio,
## prometheus-client, PyYAML, pyelftools, bcrypt); the artifacts (image, wheel) are built once, by `make test`
lowest: setup $(LOW_STAMP)
	$(LOW_VENV)/bin/python -m pytest -m 'not vm and not artifacts' $(PYTEST_ARGS)

## unit: the tests that need no VM
unit: setup
	$(PY) -m pytest -m 'not vm' $(PYTEST_ARGS)

## vmtest: only the VM tests (one boot per kernel; each runs the scenarios its tests ask of it)
vmtest: setup kernels wheel
	$(PY) -m pytest -m vm $(PYTEST_ARGS)

## docs: the documentation site in build/site (mkdocs --strict; tests/test_docs.py builds it in `make test`)
docs: setup
	$(PY) -m mkdocs build --strict --quiet

lint: setup
	$(PY) -m ruff check .

## demo: boot 6.12 and trace the bundled failure workload
demo: setup kernels
	tests/vm/run --kernel 6.12 -- python -m tests.demo

clean:
	rm -rf build *.egg-info .pytest_cache .ruff_cache .benchmarks
	find . \( -path ./$(VENV) -o -path ./$(LOW_VENV) \) -prune -o -name __pycache__ -type d -print0 | xargs -0 rm -rf
	@$(MAKE) --no-print-directory -s -C bpf clean OUT=$(CURDIR)/retsnoop_otel/bpf
	rm -f $(LIBBPF_SO) $(TABLES_SO) $(PRINT_SO) retsnoop_otel/bpf/LICENSE.libbpf retsnoop_otel/bpf/LICENSE.libelf
	rm -rf dist

distclean: clean
	rm -rf $(VENV) $(LOW_VENV)
