#!/usr/bin/env bash
# Regenerates the SYNTHETIC placeholder histogram and row map of the Qwen3-30B-A3B recipe byte for
# byte. They are NOT a profile of Qwen3's router: the rank profile is the DeepSeek-V4.1 example's
# shape (docs/formats.md, "Synthetic example data"), so the recipe has a map to check and render.
# Replace both with a profile of the lane's own traffic: recipegen profile qwen3-30b-a3b-rtx4090 chat.
# Run from the repository root:  recipes/profiles/qwen3-30b-a3b/regenerate.sh
set -euo pipefail
RECIPEGEN=${RECIPEGEN:-recipegen}
export SOURCE_DATE_EPOCH=1795910400   # 2026-11-29T00:00:00Z: pins provenance.date
"$RECIPEGEN" rowmap synth --class chat --seed 7 --tokens 20000 \
  --experts 128 --layers 0-47 --top-k 8 -o recipes/profiles/qwen3-30b-a3b
"$RECIPEGEN" rowmap build recipes/profiles/qwen3-30b-a3b/chat.hist --hot 20 \
  --bytes-per-expert 9437184 -o recipes/maps/qwen3-30b-a3b/chat.rowmap > /dev/null
echo "regenerated recipes/profiles/qwen3-30b-a3b/chat.hist and recipes/maps/qwen3-30b-a3b/chat.rowmap"
