# Functions for scripts/gpu_wheelhouse.sh, sourced (bash): split one library too large for a wheel folder between
# two folders, and write the two folders' installers. tests/test_gpu_wheelhouse.py runs them on small files.
#
#   pack_library TREE LIB DEST PIECE_BYTES  xz-compress TREE/LIB and split it into two pieces, DEST/part1/lib.xz.00
#                                           (PIECE_BYTES) and DEST/part2/lib.xz.01; everything else in TREE goes to
#                                           DEST/part2/rest.tar.xz. Exits 1 unless the archive makes exactly two.
#   write_installers DEST LIB               DEST/part1/install.sh and DEST/part2/install.sh, which unpack into
#                                           $COLO_FSM_SITE (default /opt/site); part2's joins the pieces into LIB.

pack_library() {
  local tree=$1 lib=$2 dest=$3 piece=$4
  local work
  work=$(mktemp -d)
  xz -6 -T0 -c "$tree/$lib" > "$work/lib.xz"
  split -b "$piece" -d -a 2 "$work/lib.xz" "$work/lib.xz."
  if [ ! -e "$work/lib.xz.01" ] || [ -e "$work/lib.xz.02" ]; then
    echo "error: $lib's archive ($(du -b "$work/lib.xz" | cut -f1) bytes) is not two pieces of at most $piece bytes:" \
      "change the split" >&2
    rm -rf "$work"
    return 1
  fi
  mv "$work/lib.xz.00" "$dest/part1/"
  mv "$work/lib.xz.01" "$dest/part2/"
  rm -rf "$work"
  rm "$tree/$lib"
  tar -C "$tree" -cJf "$dest/part2/rest.tar.xz" .
}

write_installers() {
  local dest=$1 lib=$2
  cat > "$dest/part1/install.sh" <<'INSTALL'
#!/usr/bin/env bash
# Unpack part1 into $COLO_FSM_SITE (default /opt/site): wheels are zip files; nothing is compiled, nothing fetched.
set -euo pipefail
here=$(dirname "$0")
site=${COLO_FSM_SITE:-/opt/site}
mkdir -p "$site"
for w in "$here"/*.whl; do python3 -m zipfile -e "$w" "$site"; done
# the large library's first piece waits here for the second, which part2 brings
cp "$here/lib.xz.00" "$site/.lib.xz.00"
touch "$site/.part1"
echo "part1 in $site; now part2"
INSTALL
  cat > "$dest/part2/install.sh" <<'INSTALL'
#!/usr/bin/env bash
# Unpack part2 into $COLO_FSM_SITE (default /opt/site) after part1, joining the large library's two pieces; exit 3
# ("COLD") where part1 is missing, 0 at once where part2 is in already.
set -euo pipefail
here=$(dirname "$0")
site=${COLO_FSM_SITE:-/opt/site}
LIB=__LIB__
test -f "$site/.part1" || { echo "COLD: part1 is not installed on this machine"; exit 3; }
test ! -f "$site/.part2" || { echo "part2 already in $site"; exit 0; }
tar -C "$site" -xJf "$here/rest.tar.xz"
mkdir -p "$site/$(dirname "$LIB")"
# into a temporary name first: a call cut short here leaves neither a truncated library nor a lost first piece
cat "$site/.lib.xz.00" "$here/lib.xz.01" \
  | python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), open(sys.argv[1], 'wb'))" \
    "$site/$LIB.partial"
mv "$site/$LIB.partial" "$site/$LIB"
for w in "$here"/*.whl; do python3 -m zipfile -e "$w" "$site"; done
touch "$site/.part2"
rm "$site/.lib.xz.00"
echo "part2 in $site"
INSTALL
  sed -i "s|__LIB__|$lib|" "$dest/part2/install.sh"
  chmod +x "$dest/part1/install.sh" "$dest/part2/install.sh"
}
