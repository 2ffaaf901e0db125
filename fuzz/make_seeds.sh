#!/usr/bin/env bash
# Makes the fuzz target's seed images (fuzz/seeds/*.img, 2 MiB each, one per image
# shape) and a starting corpus (fuzz/corpus/open_and_walk/), with mkfs.ext4 -d and
# e2fsck -fyD (which indexes the directories): no root needed. Needs e2fsprogs and
# python3; xattrs are added when setfattr works on the temp filesystem.
set -euo pipefail
cd "$(dirname "$0")"
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
mkdir -p seeds corpus/open_and_walk
make() { # name, mkfs options...
  local name=$1
  shift
  mkfs.ext4 -q -F -b 1024 "$@" -d "$tree" "seeds/$name.img" 2M >/dev/null
  e2fsck -fyD "seeds/$name.img" >/dev/null 2>&1 || [ $? -le 1 ]
}
make 0-csum
make 1-inline-data -O inline_data -I 256
make 2-indirect -O ^extent,^64bit
make 3-no-csum -O ^metadata_csum,uninit_bg
# Mutation-mode inputs: a selector byte (which seed) and no edits yet.
for i in 0 1 2 3; do printf "\\x0$i" >"corpus/open_and_walk/seed-$i"; done
ls -l seeds
