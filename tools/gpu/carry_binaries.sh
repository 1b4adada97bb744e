#!/usr/bin/env bash
# Binaries built on this machine for a device call, so that the call spends no device time on a
# build (2-3 minutes on one GPU): each TARGET of BUILD_DIR is built, stripped and staged in
# $ZGPT_BIN_STAGE (default /tmp/zgpt-gpu-bins, outside the tree: a call carries at most 64 MiB,
# tree included), with --suffix appended to its name, then the stage is packed into
# .gpu-deps/bins.tar.xz (git ignores .gpu-deps), its files under bins/.
# For an A/B in one call, stage the baseline first (check it out, build, --suffix _old), then the
# change (--suffix _new); --clear empties the stage first.
#   bash tools/gpu/carry_binaries.sh BUILD_DIR [--clear] [--suffix S] TARGET...
# On the device: mkdir -p /tmp/bins && tar xJf .gpu-deps/bins.tar.xz -C /tmp/bins
# The tests find their data through ZGPT_ORACLES and ZGPT_GPT2_DIR, and other files through the
# source path compiled in (this checkout's): link the device's tree there, and put the shared data
# beside it, before running a test binary outside ctest.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,12p' "$0"; exit 2; }
build=$1
shift
suffix=""
root=$(git rev-parse --show-toplevel)
stage=${ZGPT_BIN_STAGE:-/tmp/zgpt-gpu-bins}
mkdir -p "$stage"
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --clear) rm -f "$stage"/*; shift ;;
    --suffix) suffix=$2; shift 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || { echo "no targets" >&2; exit 2; }
cmake --build "$build" --target "${targets[@]}"
for t in "${targets[@]}"; do
  f=$build/$t
  [ -f "$f" ] || f=$build/tests/$t
  [ -f "$f" ] || { echo "$t: no binary in $build or $build/tests" >&2; exit 1; }
  cp "$f" "$stage/$t$suffix"
  strip "$stage/$t$suffix"
done
tar cf - --transform "s|^$(basename "$stage")|bins|" -C "$(dirname "$stage")" "$(basename "$stage")" | xz -T2 -6 > "$root/.gpu-deps/bins.tar.xz"
ls -l "$stage"
echo "packed: $(du -h "$root/.gpu-deps/bins.tar.xz" | cut -f1) in .gpu-deps/bins.tar.xz"
