# shellcheck shell=bash
# Sourced by the GPU bench scripts: bench_ours OUT BIN CONFIG NAME LABEL [bench_train args...]
# runs bench_train on CONFIG with the per-op table (--ops), writes OUT/ours_NAME.json, prints the
# start-up and tokens/s lines, and appends the whole log under "== LABEL" to OUT/bench.log (one
# log for every run: the device tool returns a few files).
bench_ours() {
  local out=$1 bin=$2 cfg=$3 name=$4 label=$5 t0=$SECONDS
  shift 5
  echo "== $label"
  "$bin/bench_train" -c "$cfg" --ops --out "$out/ours_$name.json" "$@" 2>&1 \
    | grep -v "^step " > "$out/ours_$name.log"
  echo "wall $((SECONDS - t0)) s (start-up included)"
  grep -E "start-up|tok/s|error|bench_train:" "$out/ours_$name.log" | head -4
  { echo "== $label"; cat "$out/ours_$name.log"; } >> "$out/bench.log"
  rm "$out/ours_$name.log"
}
