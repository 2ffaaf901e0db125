#!/usr/bin/env bash
# Makes the fuzz targets' seed images (fuzz/seeds/*.img, 2 MiB each, one per image
# shape) and starting corpora (fuzz/corpus/*/), with mkfs.ext4 -d and e2fsck -fyD
# (which indexes the directories): no root needed. Needs e2fsprogs and python3;
# xattrs are added when setfattr works on the temp filesystem.
#
# The images are the same on every run with the same e2fsprogs (fixed UUID, hash
# seed, times), so kept fuzz inputs (edits to a seed) replay exactly. With
# UEXT4_SEEDS_OUT=DIR only the seed images are made, in DIR.
set -euo pipefail
out=${UEXT4_SEEDS_OUT:-}
cd "$(dirname "$0")"
export E2FSPROGS_FAKE_TIME=1700000000 E2FSCK_TIME=1700000000
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tree=$tmp/tree
python3 - "$tree" <<'PY'
import os, sys
root = sys.argv[1]
os.makedirs(root + "/big")
os.makedirs(root + "/deep")
os.makedirs(root + "/a/b/c/d")
open(root + "/empty", "wb").close()
open(root + "/small", "wb").write(b"tiny file\n")
open(root + "/inline-size", "wb").write(b"i" * 100)
open(root + "/medium", "wb").write(bytes(i * 7 % 251 for i in range(150000)))
with open(root + "/sparse", "wb") as f:
    # Data every other KiB: hundreds of extents, a two-level extent tree.
    for i in range(400):
        f.seek(i * 2048)
        f.write(bytes([i % 200 + 1]) * 1024)
    f.truncate(400 * 2048 + 3000000)
for i in range(120):
    open(f"{root}/big/file-with-a-longish-name-{i:05}", "wb").write(f"{i}\n".encode())
for i in range(40):
    open(f"{root}/deep/n{i:04}-" + "x" * 200, "wb").close()
open(root + "/a/b/c/d/leaf", "wb").write(b"leaf\n")
os.symlink("small", root + "/short-link")
os.symlink("a/b/c/d/leaf", root + "/path-link")
os.symlink("./" * 60 + "small", root + "/long-link")
os.symlink("loop-b", root + "/loop-a")
os.symlink("loop-a", root + "/loop-b")
open(root + "/attrs", "wb").write(b"x")
PY
if command -v setfattr >/dev/null; then
  setfattr -n user.small -v 1 "$tree/attrs" 2>/dev/null || true
  setfattr -n user.big -v "$(printf 'v%.0s' $(seq 600))" "$tree/attrs" 2>/dev/null || true
fi
find "$tree" -exec touch -h -d @1700000000 {} +
seeds=${out:-seeds}
mkdir -p "$seeds"
make() { # name, mkfs options...
  local name=$1
  shift
  mkfs.ext4 -q -F -b 1024 -U 75657874-342d-6675-7a7a-2d7365656473 -E hash_seed=75657874-342d-6861-7368-2d7365656473 \
    "$@" -d "$tree" "$seeds/$name.img" 2M >/dev/null
  e2fsck -fyD "$seeds/$name.img" >/dev/null 2>&1 || [ $? -le 1 ]
}
make 0-csum
make 1-inline-data -O inline_data -I 256
make 2-indirect -O ^extent,^64bit
make 3-no-csum -O ^metadata_csum,uninit_bg
[ -n "$out" ] && exit 0
# Mutation-mode inputs: a selector byte (which seed) and no edits yet.
for target in open_and_walk write_script; do
  mkdir -p "corpus/$target"
  for i in 0 1 2 3; do printf "\\x0$i" >"corpus/$target/seed-$i"; done
done
ls -l seeds
