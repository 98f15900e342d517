#!/usr/bin/env bash
# Issue 48's first start after a reboot, ours against retsnoop v0.11 (-M): two boots of one kernel.
#   tests/vm/run --kernel 7.2 --rwdir OUT -- bash bench/start_after_reboot.sh fill
#   tests/vm/run --kernel 7.2 --rwdir OUT -- bash bench/start_after_reboot.sh measure
# fill (the first boot) leaves a kernel cache in OUT/kcache-9p (-disk), as any run of ours would (BTF, feature answers, symbols
# with where the kernel and its modules were). measure (the next boot: another KASLR offset) starts both tools with
# the page cache dropped, ours with a copy of that cache at every start (bench.start_compare --cache-from), for 6 and
# ~1,700 functions; then checks that the symbols moved from the first boot are kallsyms' own, address by address.
# TREE: the checkout to measure (default: this one); RETSNOOP_BIN: bench/build-retsnoop's binary; ROUNDS (2).
# DISK=1 (with tests/vm/run --disk IMAGE of bench/local_disk_image.sh, in both boots): everything from the local disk,
# bound before the first run of either boot so that both boots load the same modules (virtio_blk, ext4) in the same
# order, which the move of the modules' symbols needs; the figures land in *-disk files.
set -x
HERE=$(cd "$(dirname "$0")" && pwd)
T=${TREE:-$(cd "$HERE/.." && pwd)}
cd $T
export PYTHONPATH=$T RETSNOOP_BIN=${RETSNOOP_BIN:-$HOME/.cache/retsnoop-otel/peers/retsnoop-v0.11/retsnoop}
O=$RETSNOOP_OTEL_RWDIR
R=${ROUNDS:-2}
uname -r
W=9p
if [ -n "${DISK:-}" ]; then
  . "$HERE/local_disk_bind.sh"
  local_disk || exit 1
  W=disk
fi
grep -m1 -E ' T (_text|_stext)$' /proc/kallsyms | tee -a $O/text-$1-$W.txt  # where KASLR put the kernel this boot
case $1 in
fill)
  rm -rf $O/kcache-$W
  RETSNOOP_OTEL_CACHE=$O/kcache-$W python -m retsnoop_otel trace --dry-run -v -e '*sys_bpf' 2>&1 | grep Phase ;;
measure)
  for s in 6 1000; do
    python -m bench.start_compare --set $s --rounds $R --peers retsnoop --modes kprobe_session --cache-from $O/kcache-$W \
      --drop-caches > $O/start-reboot-$s-$W.txt 2>&1; tail -12 $O/start-reboot-$s-$W.txt
  done
  cp -r $O/kcache-$W /tmp/kcheck
  python - <<'PY' | tee $O/moved-check-$W.txt
from retsnoop_otel.kernel.kcache import KernelCache, kernel_identity
from retsnoop_otel.symbols.kallsyms import Kallsyms
from retsnoop_otel.symbols.kernel_facts import load_symbols
moved, _, source = load_symbols(KernelCache.at("/tmp/kcheck"), kernel_identity())
fresh = list(Kallsyms.load(stable=True).items())
print(f"symbols: {source!r}; {len(fresh)} functions; identical to kallsyms: {list(moved.items()) == fresh}")
PY
  ;;
esac
