# Sourced by the side-by-side benches: local_disk binds the package, its Python, the system python3, the tree and
# retsnoop's binary to their copies on the rslocal disk (bench/local_disk_image.sh; tests/vm/run --disk IMAGE), at
# the paths they have over 9p.
# Needs T (the tree) and RETSNOOP_BIN; returns non-zero when there is no such disk.
local_disk() {  # the same paths, bound to the rslocal disk's copies (bench/local_disk_image.sh)
  modprobe -a virtio_blk ext4 || return 1  # vng --disk attaches a virtio-blk disk
  local dev=""
  for k in $(seq 1 10); do dev=$(blkid -L rslocal) && break; sleep 1; done
  [ -n "$dev" ] || { echo "no rslocal disk (tests/vm/run --disk): the package over 9p only"; return 1; }
  local py venv
  venv=$(readlink -f $T/.venv); py=$(dirname "$(dirname "$(readlink -f $venv/bin/python)")")
  mkdir -p /run/rslocal && mount -o ro "$dev" /run/rslocal || return 1
  mount --bind /run/rslocal/py "$py" && mount --bind /run/rslocal/venv "$venv" && mount --bind /run/rslocal/tree $T \
    && mount --bind /run/rslocal/peers/retsnoop "$RETSNOOP_BIN" || return 1
  local syspy; syspy=$(readlink -f /usr/bin/python3)
  if [ -d /run/rslocal/syspy ]; then  # the system python3 and its standard library, where the image has them
    mount --bind /run/rslocal/syspy/lib "$($syspy -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')" \
      && mount --bind /run/rslocal/syspy/python3 "$syspy" || return 1
  fi
  cd $T && findmnt -T $T/retsnoop_otel && findmnt -T "$py/lib" && findmnt -T "$syspy"
}
