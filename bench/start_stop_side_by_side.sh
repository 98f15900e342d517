#!/usr/bin/env bash
# Issue 48's side-by-side in one boot, ours (default mode: kprobe.session) against retsnoop v0.11 (-M): the agent's
# start phases, start with the kernel cache empty and warm, stop, and BPF ns per call, 6 and ~1,700 functions.
#   tests/vm/run --kernel 7.2 --rwdir OUT [--disk IMAGE] -- bash bench/start_stop_side_by_side.sh
# First start: our kernel cache empty and the page cache dropped (both tools' files read again, as after a boot).
# With --disk (an image of bench/local_disk_image.sh, label rslocal), the starts run again with the same paths bound
# to that disk: the package, its Python and retsnoop read from a block device instead of the host over 9p.
# TREE: the checkout to measure (default: this one); RETSNOOP_BIN: bench/build-retsnoop's binary; ROUNDS (2);
# PYTHON_OURS: the interpreter of ours' starts (default: the system python3, Debian's, as a Debian host and the container
# image run it), through a virtualenv of its own with nothing installed (the package from PYTHONPATH), as a `pip
# install` into a virtualenv leaves it: no .pth or sitecustomize of the host's dist-packages (a text-only trace needs
# no library). The agent's starts and the per-call bench run in the repository's virtualenv.
# Figures land in $RETSNOOP_OTEL_RWDIR (start-*.txt, peer.txt, agent-*.log); bench/RESULTS.md reads them.
set -x
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(cd "${TREE:-$HERE/..}" && pwd)  # absolute: the agent's --config is given under it after the cd
cd $T
export PYTHONPATH=$T RETSNOOP_BIN=${RETSNOOP_BIN:-$HOME/.cache/retsnoop-otel/peers/retsnoop-v0.11/retsnoop}  # the host cache (the guest mounts it)
O=$RETSNOOP_OTEL_RWDIR
R=${ROUNDS:-2}
PY=${PYTHON_OURS:-/usr/bin/python3}
if [ -x "$PY" ] && "$PY" -m venv --without-pip /tmp/ours-venv; then PY=/tmp/ours-venv/bin/python; else PY=$(command -v python); fi
uname -r
"$PY" -VV
"$PY" -c 'import sys; print(sys.prefix, sys.path)'
agents() {  # the agent's start phases (its log line "agent started"): inputs against btf
  for i in 1 2 3; do
    timeout 600 python -m retsnoop_otel agent --config $T/config/agent-minimal.yaml > $O/agent-$1-$i.log 2>&1 &
    p=$!
    for k in $(seq 1 300); do grep -q "agent started" $O/agent-$1-$i.log && break; sleep 1; done
    kill -TERM $p; wait $p
    grep -o "agent started.*" $O/agent-$1-$i.log
  done
}
starts() {
  for s in 6 1000; do
    python -m bench.start_compare --set $s --rounds $R --peers retsnoop --modes kprobe_session --cold --drop-caches --python "$PY" > $O/start-cold-$s-$1.txt 2>&1; tail -12 $O/start-cold-$s-$1.txt
    python -m bench.start_compare --set $s --rounds $R --peers retsnoop --modes kprobe_session --python "$PY" > $O/start-$s-$1.txt 2>&1; tail -12 $O/start-$s-$1.txt
  done
}
. "$HERE/local_disk_bind.sh"
agents 9p
starts 9p
python -m bench.peer_compare --sets 6,1000 --modes kprobe_session --peers retsnoop --rounds 2 --json $O/peer.json > $O/peer.txt 2>&1; tail -40 $O/peer.txt
if local_disk; then
  agents disk
  starts disk
fi
