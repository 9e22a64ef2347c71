#!/bin/bash
# Build the libFuzzer targets (clang 14, -fsanitize=fuzzer,address,undefined) in build-fuzz and
# run each for SECONDS (default 60), seeded from data/, data/io/, data/traces/,
# test/corpus/bad/, the pickles inside the zip fixtures and a few small containers.
#
#   scripts/ci/fuzz.sh [SECONDS] [TARGET...]     (targets: zip pickle safetensors container trace rans)
#   env: JOBS (build parallelism, default 2), BUILD (default build-fuzz), RSS_MB (default 2048),
#        FUZZ_CC (clang, the default: native libFuzzer instrumentation; gcc: ASan/UBSan +
#        trace-pc/trace-cmp coverage + cov_shim.cpp + clang's libFuzzer engine),
#        CKPTKIT_BIN (ckpt-compress for the container seeds, default build/apps)
#
# Each target runs in libFuzzer's fork mode, so a crash does not end its run; every crash /
# leak / timeout / OOM artifact is then replayed: one of ours is copied to
# test/corpus/fuzz/<target>/ (a regression input, replayed by CTest as fuzz_regress_<target>
# in every build) and listed at the end; exit 1 when any was found or a target did not run.
# Artifacts that do not reproduce, and crashes inside libhdf5 (third-party), are listed, not
# failures. Per target the number of executions and the final coverage line go to
# build-fuzz/fuzz-summary.txt. env CONTAINER_X: fuzz_container runs that many times SECONDS
# (default 4).
set -uo pipefail
SECS=${1:-60}
shift || true
TARGETS=${*:-zip pickle safetensors container trace rans}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${BUILD:-$ROOT/build-fuzz}
JOBS=${JOBS:-2}
FUZZ_CC=${FUZZ_CC:-clang}
command -v clang >/dev/null || { echo "fuzz.sh: clang missing (apt-get install clang libclang-rt-14-dev)" >&2; exit 1; }
case $FUZZ_CC in
  clang) CCS="CC=clang CXX=clang++"; SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g" ;;
  gcc) CCS="CC=gcc CXX=g++"; SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g" ;;
  *) echo "fuzz.sh: FUZZ_CC must be clang or gcc" >&2; exit 1 ;;
esac
# a build folder configured for the other compiler is configured again from scratch
if [ -f "$B/build.ninja" ] && [ "$(cat "$B/fuzz-cc" 2>/dev/null)" != "$FUZZ_CC" ]; then
  rm -rf "$B"
fi
if [ ! -f "$B/build.ninja" ]; then
  mkdir -p "$B"
  env $CCS cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTKIT_CUDA=OFF \
    -DCKPTKIT_FUZZ=ON -DCMAKE_C_FLAGS="$SAN" -DCMAKE_CXX_FLAGS="$SAN" >/dev/null || exit 1
  echo "$FUZZ_CC" > "$B/fuzz-cc"
fi
ninja -C "$B" -j"$JOBS" $(for t in $TARGETS; do printf 'fuzz_%s ' "$t"; done) || exit 1

# ---- seed corpora (fresh each run; libFuzzer adds what it finds to the working corpus)
S=$B/seeds
rm -rf "$S"
mkdir -p "$S"/{zip,pickle,safetensors,container,trace,rans}
for f in "$ROOT"/data/*.pt "$ROOT"/data/io/*.pt "$ROOT"/test/corpus/bad/*.pt "$ROOT"/test/corpus/bad/*.bin; do
  [ -f "$f" ] && [ "$(stat -c %s "$f")" -le 2000000 ] && cp "$f" "$S/zip/"
done
for f in "$ROOT"/data/*.safetensors "$ROOT"/data/io/*.safetensors "$ROOT"/test/corpus/bad/*.safetensors; do
  [ -f "$f" ] && cp "$f" "$S/safetensors/"
done
cp "$ROOT"/test/corpus/bad/legacy_*.pt "$S/pickle/" 2>/dev/null
cp "$ROOT"/data/io/legacy.pt "$S/pickle/" 2>/dev/null
/usr/bin/python3 - "$S/pickle" "$ROOT" <<'PY'
import glob, os, sys, zipfile
out, root = sys.argv[1], sys.argv[2]
for f in glob.glob(f"{root}/data/*.pt") + glob.glob(f"{root}/data/io/*.pt") + glob.glob(f"{root}/test/corpus/bad/pickle_*.pt"):
    try:
        z = zipfile.ZipFile(f)
        for n in z.namelist():
            if n.endswith("data.pkl"):
                open(os.path.join(out, os.path.basename(f) + ".pkl"), "wb").write(z.read(n))
    except Exception:
        pass
PY
cp "$ROOT"/data/traces/*.json "$S/trace/" 2>/dev/null
if [[ " $TARGETS " == *" container "* ]]; then
  CBIN=${CKPTKIT_BIN:-}
  [ -n "$CBIN" ] || for d in "$ROOT/build/apps"; do [ -x "$d/ckpt-compress" ] && CBIN=$d && break; done
  if [ -n "$CBIN" ]; then
    "$CBIN/ckpt-compress" "$ROOT/data/cnn_adamw.safetensors" -o "$S/container/cnn_st.ckz.h5" --force >/dev/null 2>&1
    "$CBIN/ckpt-compress" "$ROOT/data/io/optim_only.pt" -o "$S/container/optim_only.ckz.h5" --optimizer adamw --force >/dev/null 2>&1
    "$CBIN/ckpt-compress" "$ROOT/data/cnn_adamw.pt" -o "$S/container/cnn_bf16.ckz.h5" --codec bf16 --force >/dev/null 2>&1
    "$CBIN/ckpt-compress" "$ROOT/data/cnn_dead.pt" -o "$S/container/cnn_log8.ckz.h5" --codec log8 --force >/dev/null 2>&1
    cp "$ROOT/data/cnn_adamw.v1.ckz.h5" "$ROOT/data/cnn_adamw.v2.ckz.h5" "$S/container/"   # container formats 1 and 2
    "$CBIN/ckpt-compress" "$ROOT/data/cnn_adamw.pt" -o "$S/container/cnn_bw8.ckz.h5" --codec blockwise8 --grad-bound inf --force >/dev/null 2>&1
  else
    echo "fuzz.sh: no ckpt-compress found (CKPTKIT_BIN); container target seeded from bad files only" >&2
  fi
  cp "$ROOT"/test/corpus/bad/garbage.bin "$S/container/" 2>/dev/null
fi
for t in $TARGETS; do
  [ -d "$ROOT/test/corpus/fuzz/$t" ] && cp "$ROOT"/test/corpus/fuzz/$t/* "$S/$t/" 2>/dev/null
done

# ---- run (a unit over -timeout is a timeout artifact; slower units under it are not findings:
# a 44 ms pickle input was once reported as a 10 s "slow unit" on a loaded 2-core machine).
# Fork mode (-fork=FUZZ_FORK, default nproc; -ignore_crashes=1): jobs run in child processes,
# one per core, so a crash does not end the target's run; every artifact is replayed
# afterwards and classified (below). fuzz_container gets CONTAINER_X (default 4) times
# SECONDS: its inputs open an HDF5 file each (a few hundred a second per core), and the
# container and manifest parsers get >= 100k runs in CI's stage that way.
SUM=$B/fuzz-summary.txt
: > "$SUM"
found=0
ENVS=(TMPDIR="$B/tmp" ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
      LSAN_OPTIONS=print_suppressions=0:suppressions=$ROOT/test/lsan.supp)
for t in $TARGETS; do
  W=$B/work/$t
  A=$B/artifacts/$t
  T=$SECS
  [ "$t" = container ] && T=$((SECS * ${CONTAINER_X:-4}))
  rm -rf "$A"
  mkdir -p "$W" "$A"
  echo "fuzz.sh: fuzz_$t for ${T}s" >&2
  mkdir -p "$B/tmp"   # scratch files of the targets (fuzz_common.h); a crash leaves one here
  (cd "$B" && env "${ENVS[@]}" "$B/test/fuzz/fuzz_$t" "$W" "$S/$t" -fork="${FUZZ_FORK:-$(nproc)}" -ignore_crashes=1 -max_total_time="$T" -timeout=10 \
      -report_slow_units=3600 -rss_limit_mb="${RSS_MB:-2048}" -max_len=$((1 << 20)) -artifact_prefix="$A/" -close_fd_mask=3 \
      > "$B/fuzz_$t.log" 2>&1)
  rc=$?
  # fork mode's progress lines: "#EXECS: cov: C ft: F corp: N exec/s R oom/timeout/crash: a/b/c time: ..."
  last=$(grep -E '^#[0-9]+: cov' "$B/fuzz_$t.log" | tail -1)
  execs=$(echo "$last" | grep -oE '^#[0-9]+' | tr -d '#')
  cov=$(echo "$last" | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+')
  printf '%-12s exit %-3s execs %-10s %s  artifacts %s\n' "$t" "$rc" "${execs:-?}" "${cov:-}" "$(ls "$A" | wc -l)" | tee -a "$SUM"
  if [ -z "$execs" ]; then
    found=1
    echo "  fuzz_$t did not run: see $B/fuzz_$t.log" | tee -a "$SUM"
    continue
  fi
  # Each artifact replayed once (same sanitizer options) and classified:
  #  - it does not reproduce (exit 0; fork mode also writes an empty crash file for a job that
  #    died outside an input): reported, not a regression input;
  #  - the innermost frame, past libc's, libFuzzer's and the sanitizer's own (memcpy, strlen,
  #    malloc, interceptors, the malloc-limit hook), is inside libhdf5 (Debian's HDF5 1.10 overreads some malformed object
  #    headers, e.g. H5Aexists -> H5MM_strdup of an unterminated attribute name; H5Dread of a
  #    malformed contiguous layout copies from a null pointer, H5VM_memcpyvv; H5C_protect
  #    allocates an object header's size as the file states it, 4 GiB): a third-party
  #    finding, reported and kept in $A (docs/reliability.md), not a failure of our code and not
  #    a regression input (its replay would crash the fuzz_regress test too);
  #  - anything else is ours: copied to test/corpus/fuzz/<target>/ and the stage fails.
  for a in "$A"/*; do
    [ -f "$a" ] || continue
    R=$B/replay_${t}_$(basename "$a").log
    env "${ENVS[@]}" "$B/test/fuzz/fuzz_$t" "$a" -timeout=10 -rss_limit_mb="${RSS_MB:-2048}" > "$R" 2>&1
    if [ $? -eq 0 ]; then
      echo "  $(basename "$a"): does not reproduce (kept in $A)" | tee -a "$SUM"
      continue
    fi
    inner=$(awk '/ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error|deadly signal/ {on = 1} on && /^ *#[0-9]+ / {print; n++} on && n && /^ *$/ {exit}' "$R" |
      grep -vE ' in (fuzzer::|__interceptor_|__asan|__sanitizer|__lsan|__mem|__str|mem|str|malloc|calloc|realloc|free|operator new)[a-zA-Z_0-9:]*[^a-zA-Z_0-9]|/libc\.so|sysdeps/' | head -1)
    if echo "$inner" | grep -qE 'libhdf5|in H5[A-Z]'; then
      echo "  $(basename "$a"): third-party finding inside libhdf5 (kept in $A, see docs/reliability.md): $(echo "$inner" | sed 's/^ *//' | cut -c1-160)" | tee -a "$SUM"
      continue
    fi
    found=1
    mkdir -p "$ROOT/test/corpus/fuzz/$t"
    cp "$a" "$ROOT/test/corpus/fuzz/$t/$(basename "$a")"
    echo "  finding: test/corpus/fuzz/$t/$(basename "$a")" | tee -a "$SUM"
    grep -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error|SUMMARY' "$R" | head -5 | tee -a "$SUM"
    # the report itself (stack, the signal, the unit in base64 when small): a CI run's finding
    # can then be studied without its machine (its artifact does not come back)
    awk '/^==[0-9]+==|runtime error|deadly signal/ {on = 1} on' "$R" | grep -v '^MS: \|^#[0-9]' | head -60 | sed 's/^/    | /' | tee -a "$SUM"
    # and the unit itself when it is small (libFuzzer's replay does not print it)
    if [ "$(stat -c %s "$a")" -le 8192 ]; then
      echo "    unit (base64, $(stat -c %s "$a") bytes): $(base64 -w0 "$a")" | tee -a "$SUM"
    fi
  done
done
exit $found
