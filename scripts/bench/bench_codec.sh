#!/usr/bin/env bash
# Codec benchmark of ckpt-compress / ckpt-restore (the codec half of the benchmarks issue).
#
#   scripts/bench/bench_codec.sh [--quick] [--models DIR] [--results DIR] [--reps N] [--rss "1 4 8"]
#                          [--commit REV] [--only REGEX] [--append] [--no-profile]
#                          [--no-train] [--no-doc]
#
# --commit REV: benchmark a clean `git archive REV` export (built in MODELS/src-REV/build)
# instead of the working tree (build-bench/), so others' uncommitted edits are not measured.
# --only REGEX: only inputs whose file name matches; --append: add to results.jsonl instead
# of starting it anew (a doc can then combine runs, e.g. fixtures while a model still trains).
# Environment: BUILD (build dir of the working tree), NO_BUILD=1 (use the binaries as they are),
# CKPTKIT_BENCH_DIR (models cache), RESULTS, RSS_GIB_QUICK.
#
# For every fixture data/*.pt data/*.safetensors plus the two larger cached REAL checkpoints
# (scripts/bench/train_bench_models.py, ~/.cache/ckptkit-bench/ by default):
#   - codecs vlog (default) / log8 / bf16 / blockwise8 at tolerance 0.01 with G=1 and G=inf,
#     and a vlog and log8 tolerance sweep 0.001 / 0.003 / 0.01 / 0.03 / 0.1 (G=1): moment
#     reduction, escapes (by cause), bits per value per moment, whole-file size (container vs
#     `zstd -19` of the input), and `zstd -19` of the raw moment bytes (the lossless bound);
#   - encode (ckpt-compress) and decode (ckpt-restore) time as RATIOS, all measured in this run,
#     to log8 and the bf16 codec, to `zstd -3 -T1` / `zstd -d` over the same raw FP32 moment bytes
#     (extracted by scripts/bench/bench_moments.py) and to a plain `cat` of them (memory copy
#     from the page cache); median of --reps runs; CPU time (user+sys) and wall time;
#   - thread scaling: the same compress pinned to 1 core and to 2 cores (taskset);
#   - peak RSS (/usr/bin/time) compressing generated checkpoints of 1, 4, 8 GiB
#     (scripts/fixtures/gen_checkpoint.py, or GEN=...);
#   - a perf profile of ckpt-compress (vlog) on the larger LM: top functions.
# Raw results: one JSON object per line in RESULTS/results.jsonl; then
# scripts/bench/bench_report.py writes docs/benchmarks.md and docs/bench_codec_tolerance.svg.
# --quick: 1 timed rep (instead of --reps) for the two large models and peak RSS only at
# 1 GiB (RSS_GIB_QUICK="1 4" overrides); the doc says which mode produced it.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build-bench}
MODELS=${CKPTKIT_BENCH_DIR:-$HOME/.cache/ckptkit-bench}
RESULTS=${RESULTS:-$MODELS/results}
REPS=3
QUICK=0
RSS_GIB="1 4 8"
TRAIN=1
DOC=1
COMMIT=""
ONLY=""
APPEND=0
PROFILE=1
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --models) MODELS=$2; shift ;;
        --results) RESULTS=$2; shift ;;
        --reps) REPS=$2; shift ;;
        --rss) RSS_GIB=$2; RSS_SET=1; shift ;;
        --no-train) TRAIN=0 ;;
        --commit) COMMIT=$2; shift ;;
        --only) ONLY=$2; shift ;;
        --append) APPEND=1 ;;
        --no-profile) PROFILE=0 ;;
        --no-doc) DOC=0 ;;
        -h|--help) sed -n 2,25p "$0"; exit 0 ;;
        *) echo "bench_codec.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
BIG_REPS=$REPS
if [ $QUICK = 1 ]; then BIG_REPS=1; [ "${RSS_SET:-0}" = 1 ] || RSS_GIB=${RSS_GIB_QUICK:-1}; fi
PY=/usr/bin/python3
SRC=$ROOT
if [ -n "$COMMIT" ]; then
    COMMIT=$(git -C "$ROOT" rev-parse --short "$COMMIT") || exit 2
    SRC=$MODELS/src-$COMMIT
    if [ ! -f "$SRC/CMakeLists.txt" ]; then
        mkdir -p "$SRC" && git -C "$ROOT" archive "$COMMIT" | tar -x -C "$SRC" || exit 1
    fi
    BUILD=$SRC/build
fi
COMPRESS=$BUILD/apps/ckpt-compress
RESTORE=$BUILD/apps/ckpt-restore
VERIFY=$BUILD/apps/ckpt-verify
mkdir -p "$RESULTS"
OUT=$RESULTS/results.jsonl
[ $APPEND = 1 ] || : > "$OUT"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/bench_codec.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
log() { echo "[bench_codec $(date +%H:%M:%S)] $*" >&2; }

# ---------------------------------------------------------------- build and models
if [ ! -x "$COMPRESS" ] || [ ! -x "$RESTORE" ] || [ ! -x "$VERIFY" ]; then
    log "building into $BUILD"
    cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
fi
[ "${NO_BUILD:-0}" = 1 ] || nice -n 10 ninja -j2 -C "$BUILD" ckpt-compress ckpt-verify ckpt-restore >/dev/null || exit 1
if [ $TRAIN = 1 ]; then
    nice -n 10 $PY "$ROOT/scripts/bench/train_bench_models.py" --out "$MODELS" >&2 || exit 1
fi

# ---------------------------------------------------------------- helpers
# emit KEY=VALUE... : append one JSON object (values that parse as JSON are kept raw)
emit() {
    $PY - "$@" >> "$OUT" <<'EOF'
import json, sys
o = {}
for kv in sys.argv[1:]:
    k, v = kv.split("=", 1)
    try:
        o[k] = json.loads(v)
    except ValueError:
        o[k] = v
print(json.dumps(o))
EOF
}
# timed LABEL... -- CMD: run CMD once under /usr/bin/time; sets T_WALL T_CPU T_RSS T_RC
timed() {
    local t0 t1
    t0=$(date +%s.%N)
    /usr/bin/time -f '%U %S %M' -o "$TMP/time" "$@" > "$TMP/stdout" 2> "$TMP/stderr"
    T_RC=$?
    t1=$(date +%s.%N)
    T_WALL=$(echo "$t1 - $t0" | bc -l)
    read -r u s T_RSS < <(tail -1 "$TMP/time")
    T_CPU=$(echo "$u + $s" | bc -l)
}
# bench REPS KEY=VAL... -- CMD: REPS timed runs, one result line each (rep, wall, cpu, rss, rc)
bench() {
    local reps=$1; shift
    local tags=()
    while [ "$1" != "--" ]; do tags+=("$1"); shift; done
    shift
    local r
    for r in $(seq 1 "$reps"); do
        timed "$@"
        local err=""
        [ $T_RC != 0 ] && err=$(head -c 300 "$TMP/stderr" | tr '\n"' ' ' )
        emit "${tags[@]}" rep=$r wall=$T_WALL cpu=$T_CPU rss_kb=$T_RSS rc=$T_RC "error=$err"
    done
}

# ---------------------------------------------------------------- per input
INPUTS=()
for f in "$ROOT"/data/*.pt "$ROOT"/data/*.safetensors; do [ -f "$f" ] && INPUTS+=("$f"); done
for f in "$MODELS/resnet18_adamw.pt" "$MODELS/lm10m_adamw.pt"; do [ -f "$f" ] && INPUTS+=("$f"); done

for f in "${INPUTS[@]}"; do
    name=$(basename "$f")
    if [ -n "$ONLY" ] && ! [[ $name =~ $ONLY ]]; then continue; fi
    big=0; reps=$REPS
    case "$f" in "$MODELS"/*) big=1; reps=$BIG_REPS ;; esac
    log "$name"
    mom="$TMP/moments.bin"
    info=$($PY "$ROOT/scripts/bench/bench_moments.py" "$f" "$mom") || { log "$name: moment extraction failed"; continue; }
    emit kind=input input=$name big=$big file_bytes=$(stat -c %s "$f") "moments=$info"
    cat "$mom" > /dev/null; cat "$f" > /dev/null   # warm the page cache for every reference
    # compress: every codec at tol 0.01, G=1 (timed reps) and G=inf (one run)
    for codec in bf16 vlog log8 blockwise8; do
        for G in 1.0 inf; do
            n=$reps; [ $G = inf ] && n=1
            bench $n kind=compress input=$name codec=$codec tol=0.01 G=$G -- \
                "$COMPRESS" "$f" -o "$TMP/$codec.$G.ckz.h5" --codec $codec --tolerance 0.01 --grad-bound $G --json --force
            if [ $T_RC = 0 ]; then
                $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); d.pop("tensors",None); print(json.dumps(d))' "$TMP/stdout" > "$TMP/summary"
                emit kind=summary input=$name codec=$codec tol=0.01 G=$G "json=$(cat "$TMP/summary")"
            fi
        done
        # decode: restore the G=1 container
        if [ -f "$TMP/$codec.1.0.ckz.h5" ]; then
            bench $reps kind=restore input=$name codec=$codec -- \
                "$RESTORE" "$TMP/$codec.1.0.ckz.h5" -o "$TMP/restored.pt" --force
            rm -f "$TMP/restored.pt"
        fi
    done
    # verify (vlog and log8, G=1) against the original: the guarantee must hold
    for codec in vlog log8; do
        if [ -f "$TMP/$codec.1.0.ckz.h5" ]; then
            bench 1 kind=verify input=$name codec=$codec -- "$VERIFY" "$TMP/$codec.1.0.ckz.h5" --original "$f" --json
        fi
    done
    # tolerance sweeps (0.01 is above)
    for codec in vlog log8; do
        for tol in 0.001 0.003 0.03 0.1; do
            bench 1 kind=compress input=$name codec=$codec tol=$tol G=1.0 -- \
                "$COMPRESS" "$f" -o "$TMP/sweep.ckz.h5" --codec $codec --tolerance $tol --json --force
            if [ $T_RC = 0 ]; then
                $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); d.pop("tensors",None); print(json.dumps(d))' "$TMP/stdout" > "$TMP/summary"
                emit kind=summary input=$name codec=$codec tol=$tol G=1.0 "json=$(cat "$TMP/summary")"
            fi
        done
    done
    # references over the same raw moment bytes
    bench $reps kind=ref input=$name what=zstd3 -- zstd -3 -T1 -q -f "$mom" -o "$TMP/mom.zst"
    emit kind=size input=$name what=zstd3_moments bytes=$(stat -c %s "$TMP/mom.zst")
    bench $reps kind=ref input=$name what=unzstd -- zstd -d -T1 -q -f "$TMP/mom.zst" -o "$TMP/mom.out"
    bench $reps kind=ref input=$name what=cat -- cat "$mom"
    # the lossless bound: zstd -19 of the raw moment bytes (one run)
    bench 1 kind=ref input=$name what=zstd19_moments -- zstd -19 -T1 -q -f "$mom" -o "$TMP/mom19.zst"
    emit kind=size input=$name what=zstd19_moments bytes=$(stat -c %s "$TMP/mom19.zst")
    # whole file vs zstd -19 of the input (one run)
    bench 1 kind=ref input=$name what=zstd19_file -- zstd -19 -T1 -q -f "$f" -o "$TMP/file.zst"
    emit kind=size input=$name what=zstd19_file bytes=$(stat -c %s "$TMP/file.zst")
    # thread scaling on the large models: pinned to 1 core vs 2 cores
    if [ $big = 1 ]; then
        # the optimizer kind stated (torch 1.13 files do not say Adam vs AdamW; auto certifies both)
        bench 1 kind=compress input=$name codec=vlog_adamw tol=0.01 G=1.0 -- \
            "$COMPRESS" "$f" -o "$TMP/k.ckz.h5" --codec vlog --optimizer adamw --json --force
        if [ $T_RC = 0 ]; then
            $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); d.pop("tensors",None); print(json.dumps(d))' "$TMP/stdout" > "$TMP/summary"
            emit kind=summary input=$name codec=vlog_adamw tol=0.01 G=1.0 "json=$(cat "$TMP/summary")"
        fi
        for cores in 0 0,1; do
            bench $reps kind=threads input=$name cores=$cores what=vlog -- \
                taskset -c $cores "$COMPRESS" "$f" -o "$TMP/t.ckz.h5" --codec vlog --json --force
            bench $reps kind=threads input=$name cores=$cores what=zstd3_T0 -- \
                taskset -c $cores zstd -3 -T0 -q -f "$mom" -o "$TMP/t.zst"
        done
    fi
    rm -f "$TMP"/*.ckz.h5 "$TMP"/*.zst "$TMP/mom.out" "$mom"
done

# ---------------------------------------------------------------- profile on the larger LM
LM="$MODELS/lm10m_adamw.pt"
if [ $PROFILE = 1 ] && [ -f "$LM" ] && command -v perf >/dev/null; then
    log "perf profile on $(basename "$LM")"
    if perf record -F 499 -g -o "$TMP/perf.data" -- "$COMPRESS" "$LM" -o "$TMP/p.ckz.h5" --json > /dev/null 2> "$TMP/perf.err"; then
        perf report -i "$TMP/perf.data" --no-children --sort symbol --stdio 2>/dev/null \
            | grep -E '^ +[0-9.]+%' | sed -E 's/ +- +- *$//' | head -15 > "$RESULTS/perf_top.txt"
    else
        head -c 300 "$TMP/perf.err" > "$RESULTS/perf_top.txt"
    fi
fi

# ---------------------------------------------------------------- peak RSS vs checkpoint size
# scripts/fixtures/gen_checkpoint.py (moments shaped like a trained LM's; also used by rss_check.sh).
GEN=${GEN:-$ROOT/scripts/fixtures/gen_checkpoint.py}
for gib in $RSS_GIB; do
    big="$TMP/big_${gib}g.pt"
    log "peak RSS at ${gib} GiB ($(basename "$GEN"))"
    if ! nice -n 10 $PY "$GEN" --gib "$gib" -o "$big" > /dev/null 2> "$TMP/gen.err"; then
        emit kind=rss gib=$gib rc=-1 "error=generator failed: $(head -c 200 "$TMP/gen.err" | tr '\n"' ' ')"
        continue
    fi
    bench 1 kind=rss gib=$gib file_bytes=$(stat -c %s "$big") codec=vlog -- \
        "$COMPRESS" "$big" -o "$TMP/big.ckz.h5" --json
    [ $T_RC = 0 ] && emit kind=rss_summary gib=$gib "json=$($PY -c 'import json,sys; d=json.load(open(sys.argv[1])); d.pop("tensors",None); print(json.dumps(d))' "$TMP/stdout")"
    rm -f "$big" "$TMP/big.ckz.h5"
done

emit kind=meta date="$(date -u +%Y-%m-%dT%H:%MZ)" quick=$QUICK reps=$REPS big_reps=$BIG_REPS \
    "cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)" nproc=$(nproc) \
    "gpu=$(command -v nvidia-smi >/dev/null && nvidia-smi -L | head -1 || echo none)" \
    "commit=${COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD)+worktree}" "only=$ONLY" "rss_gib=$RSS_GIB" "load=$(cut -d' ' -f1-3 /proc/loadavg)" \
    "zstd=$(zstd --version | head -1)" "gen=$(basename "$GEN")"
log "results: $OUT"
if [ $DOC = 1 ]; then
    $PY "$ROOT/scripts/bench/bench_report.py" "$RESULTS" --models "$MODELS" --doc "$ROOT/docs/benchmarks.md" \
        --svg "$ROOT/docs/bench_codec_tolerance.svg"
fi
