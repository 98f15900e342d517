#!/usr/bin/env bash
# Issue 48's "from a local disk": the checkout TREE, its virtualenv, the Python it runs on, the system python3 (the
# interpreter and its standard library) and retsnoop's binary on an ext4 image (label rslocal) that
# bench/start_stop_side_by_side.sh mounts in the VM and binds over the paths they have on the host, so the same
# commands read the same files from a block device instead of the host over 9p.
#   bash bench/local_disk_image.sh TREE IMAGE
#   tests/vm/run --kernel 7.2 --disk IMAGE --rwdir OUT -- env TREE=TREE bash bench/start_stop_side_by_side.sh
# Left out: what no start reads (Python's tests, tkinter, the docs tools and linters of the virtualenv); the
# virtualenv's site-packages otherwise whole. RETSNOOP_BIN: retsnoop's binary (default: bench/build-retsnoop's).
set -euo pipefail
TREE=$(cd "$1" && pwd) IMG=$2
if [ ! -L "$TREE/.venv" ]; then  # the guest binds the image's tree over TREE: a real .venv there would link to itself
  echo "$TREE/.venv is not a link: measure a worktree (git worktree add DIR; ln -s $(pwd)/.venv DIR/.venv)" >&2
  exit 2
fi
RS=${RETSNOOP_BIN:-$HOME/.cache/retsnoop-otel/peers/retsnoop-v0.11/retsnoop}
VENV=$(readlink -f "$TREE/.venv")
PYROOT=$(dirname "$(dirname "$(readlink -f "$VENV/bin/python")")")
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/py" "$STAGE/venv" "$STAGE/tree" "$STAGE/peers"
tar -C "$PYROOT" --exclude=./lib/python3.11/site-packages --exclude=./lib/python3.11/test \
  --exclude='./lib/python3.11/config-*' --exclude=./lib/python3.11/idlelib --exclude=./lib/python3.11/tkinter \
  --exclude=./lib/python3.11/lib2to3 --exclude=./lib/python3.11/ensurepip --exclude=./share --exclude=./include \
  -cf - . | tar -C "$STAGE/py" -xf -
SP=./lib/python3.11/site-packages
tar -C "$VENV" --exclude="$SP/kubernetes_validate" --exclude="$SP/material" --exclude="$SP/babel" \
  --exclude="$SP/pip" --exclude="$SP/mkdocs*" --exclude="$SP/pygments" --exclude="$SP/setuptools" \
  --exclude="$SP/mypy*" --exclude="$SP/ruff*" -cf - . | tar -C "$STAGE/venv" -xf -
tar -C "$TREE" --exclude=./.git --exclude=./.venv --exclude=./dist --exclude=./build -cf - . | tar -C "$STAGE/tree" -xf -
ln -s "$VENV" "$STAGE/tree/.venv"  # the virtualenv by its host path, which the guest binds to the image's copy
cp -p "$RS" "$STAGE/peers/retsnoop"
# the system python3 (Debian's), which the side by side runs ours under as a Debian host does: its standard library and
# its interpreter, one file (libpython is linked in)
SYSLIB=$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
mkdir -p "$STAGE/syspy/lib"
tar -C "$SYSLIB" --exclude=./test --exclude='./config-*' --exclude=./idlelib --exclude=./tkinter --exclude=./lib2to3 \
  --exclude=./ensurepip -cf - . | tar -C "$STAGE/syspy/lib" -xf -
cp -p "$(readlink -f /usr/bin/python3)" "$STAGE/syspy/python3"
du -sh "$STAGE"/*
rm -f "$IMG"
mke2fs -q -t ext4 -L rslocal -E root_owner=0:0 -d "$STAGE" "$IMG" 1500M
echo "$IMG: $(du -h "$IMG" | cut -f1) used of 1.5G"
