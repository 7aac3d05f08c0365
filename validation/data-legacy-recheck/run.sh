#!/bin/bash
# The legacy sweep's compute-bound regime re-checked (validation/README.md, "The legacy
# sweep", 2026-11-28): 1 and 4 workers per rank, each with and without a "keep-awake"
# process (a loop of 0.5 ms sleeps that keeps a core from idling deeply), 3 repeats,
# interleaved, 400 iterations x 1 epoch, seed 0 (the legacy sweep's cost table), alone.
# Run from the repository root, with torch installed:  bash validation/data-legacy-recheck/run.sh OUT
# (the committed logs were written to /tmp/legacy_exp and gzipped into this directory;
# run.log is the script's own output: start time and 1-min load before each run).
set -u
out=${1:?usage: run.sh OUT}
mkdir -p "$out"
for rep in 1 2 3; do
    for w in 1 4; do
        for ka in 0 1; do
            name=cb_w${w}_ka${ka}_r$rep
            if [ "$ka" = 1 ]; then
                python -c "
import time
while True: time.sleep(0.0005)" &
                kp=$!
            fi
            echo "$(date +%T) $name load $(cut -d' ' -f1 /proc/loadavg)"
            python -m validation.job --regime compute-bound --workers "$w" --prefetch-factor 2 \
                --align none --ranks 4 --iterations 400 --epochs 1 --batch-size 8 --seed 0 \
                --out "$out" --name "$name" > "$out/$name.out" 2>&1
            if [ "$ka" = 1 ]; then kill "$kp"; wait "$kp" 2>/dev/null; fi
        done
    done
done
echo done
