#!/usr/bin/env bash
# GPT-2 BPE shards of about 21M tokens of real text for the z-loss study (configs/zloss-16m.yaml):
# the King James Bible, Webster's 1913 dictionary (GCIDE) and the Python 3.11 documentation
# sources, from Debian's packages bible-kjv, dict-gcide and python3.11-doc.
#
#   bash tools/zloss_data.sh [TEXT_DIR] [GPT2_DIR]
#
# TEXT_DIR (default data/shards/zloss_text) caches the three texts gzipped; when it already holds
# them (a machine without the network), the packages are not needed. GPT2_DIR holds OpenAI's
# encoder.json and vocab.bpe (default: TEXT_DIR if they are there, else ../shared/data/gpt2).
set -euo pipefail
cd "$(dirname "$0")/.."
texts=${1:-data/shards/zloss_text}
mkdir -p "$texts"
if [ ! -s "$texts/kjv.txt.gz" ] || [ ! -s "$texts/gcide.txt.gz" ] || [ ! -s "$texts/pydoc.txt.gz" ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get install -y -q bible-kjv dict-gcide python3.11-doc >/dev/null
  bible -f "Gen1:1-Rev22:21" | gzip -9 > "$texts/kjv.txt.gz"
  cp /usr/share/dictd/gcide.dict.dz "$texts/gcide.txt.gz"   # dictzip is gzip-compatible
  find /usr/share/doc/python3.11/html/_sources -name '*.rst.txt' | sort | xargs cat | gzip -9 > "$texts/pydoc.txt.gz"
fi
gpt2=${2:-}
if [ -z "$gpt2" ]; then
  if [ -s "$texts/encoder.json" ]; then gpt2=$texts; else gpt2=../shared/data/gpt2; fi
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for t in kjv gcide pydoc; do gzip -dc "$texts/$t.txt.gz" > "$tmp/$t.txt"; done
bin=${ZGPT_BIN:-build}   # where prepare_data is (a GPU machine's build-gpu, say)
[ -x "$bin/prepare_data" ] || bash tools/build.sh
"$bin/prepare_data" --input "$tmp/kjv.txt" --input "$tmp/gcide.txt" --input "$tmp/pydoc.txt" \
  --out data/shards/zloss_gpt2 --tokenizer gpt2 --gpt2-dir "$gpt2"
