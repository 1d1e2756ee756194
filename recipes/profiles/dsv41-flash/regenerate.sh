#!/usr/bin/env bash
# Regenerates the SYNTHETIC example histograms and row maps of the reference recipe's traffic
# classes (agent, prose, math) byte for byte. No real DeepSeek-V4.1 histograms exist here:
# these are generated (docs/formats.md, "Synthetic example data") and marked so inside.
# Run from the repository root:  recipes/profiles/dsv41-flash/regenerate.sh
set -euo pipefail
RECIPEGEN=${RECIPEGEN:-recipegen}
export SOURCE_DATE_EPOCH=1795910400   # 2026-11-29T00:00:00Z: pins provenance.date
"$RECIPEGEN" rowmap synth --seed 41 --tokens 47778 --correlation 0.15 \
  --experts 384 --layers 0-39 --top-k 6 -o recipes/profiles/dsv41-flash
for class in agent prose math; do
  "$RECIPEGEN" rowmap build "recipes/profiles/dsv41-flash/$class.hist" --hot 295 \
    --bytes-per-expert 18800640 -o "recipes/maps/dsv41-flash/$class.rowmap" > /dev/null
done
echo "regenerated recipes/profiles/dsv41-flash/*.hist and recipes/maps/dsv41-flash/*.rowmap"
