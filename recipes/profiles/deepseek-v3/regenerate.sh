#!/usr/bin/env bash
# Regenerates the SYNTHETIC placeholder histogram and row map of the DeepSeek-V3 8x H200 recipe byte
# for byte. They are NOT a profile of DeepSeek-V3's router: the rank profile is the DeepSeek-V4.1
# example's shape (docs/formats.md, "Synthetic example data"), so the recipe has a map to check and
# render. Replace both with a profile of the lane's own traffic: recipegen profile deepseek-v3-fp8-h200x8 chat.
# Under TP=8 one map serves all eight ranks (each re-homes its own shard of the same experts).
# Run from the repository root:  recipes/profiles/deepseek-v3/regenerate.sh
set -euo pipefail
RECIPEGEN=${RECIPEGEN:-recipegen}
export SOURCE_DATE_EPOCH=1795910400   # 2026-11-29T00:00:00Z: pins provenance.date
"$RECIPEGEN" rowmap synth --class chat --seed 11 --tokens 20000 \
  --experts 256 --layers 3-60 --top-k 8 -o recipes/profiles/deepseek-v3
"$RECIPEGEN" rowmap build recipes/profiles/deepseek-v3/chat.hist --hot 192 \
  --bytes-per-expert 44050944 -o recipes/maps/deepseek-v3/chat.rowmap > /dev/null
echo "regenerated recipes/profiles/deepseek-v3/chat.hist and recipes/maps/deepseek-v3/chat.rowmap"
