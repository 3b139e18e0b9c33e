#!/bin/sh
# check.sh ok|hole NAME [SPIN_FLAG...]: one check of `make model`. Generates the verifier for
# reservation.pml with spin -a SPIN_FLAG..., compiles it and runs it, printing when it starts, every
# PROGRESS_SECONDS how many states it has stored so far, and when it ends with its states and times.
#   ok:   the configuration must have no violation. Compiled with MODEL_OK_CFLAGS (optimised: the
#         search is exhaustive and takes most of the target's time).
#   hole: a HOLE_* mutation; SPIN must find a violation. pan stops at the first one (its default,
#         -c1), so these searches are short: compiled with MODEL_HOLE_CFLAGS (unoptimised, a tenth
#         of the compile time) and a smaller hash table. Both keep the search exhaustive (no
#         BITSTATE or hash-compact, which can miss states).
set -eu
mode=$1 name=$2
shift 2
: "${MODEL_OK_CFLAGS:=-w -O2 -DSAFETY -DCOLLAPSE}"
: "${MODEL_HOLE_CFLAGS:=-w -O0 -DSAFETY -DCOLLAPSE}"
: "${MODEL_OK_PANFLAGS:=-m1000000 -w26}"
: "${MODEL_HOLE_PANFLAGS:=-m1000000 -w22}"
: "${PROGRESS_SECONDS:=30}"
case $mode in
ok) cflags=$MODEL_OK_CFLAGS panflags=$MODEL_OK_PANFLAGS ;;
hole) cflags=$MODEL_HOLE_CFLAGS panflags=$MODEL_HOLE_PANFLAGS ;;
*) echo "check.sh: mode must be ok or hole, not $mode" >&2; exit 2 ;;
esac
model=$(cd "$(dirname "$0")" && pwd)/reservation.pml
tmp=$(mktemp -d)
trap 'kill "$pan" 2>/dev/null || true; rm -rf "$tmp"' EXIT
pan=
cd "$tmp"
start=$(date +%s)
echo "$name: started (spin -a $*)"
cp "$model" .
spin -a "$@" reservation.pml >spin.log || { cat spin.log; echo "$name: spin -a failed"; exit 1; }
# shellcheck disable=SC2086 # the flags are words
gcc $cflags -o pan pan.c
compiled=$(date +%s)
# pan prints a States= line every million states; line-buffered (stdbuf, where coreutils has it)
# so that the progress lines above can read them while it runs.
line=
command -v stdbuf >/dev/null 2>&1 && line="stdbuf -oL"
# shellcheck disable=SC2086
$line ./pan $panflags >pan.log 2>&1 &
pan=$!
last=$compiled
while kill -0 "$pan" 2>/dev/null; do
  sleep 1
  now=$(date +%s)
  if [ $((now - last)) -ge "$PROGRESS_SECONDS" ]; then
    last=$now
    states=$(grep -o 'States= *[0-9.e+]*' pan.log | tail -1 | tr -s ' ' | sed 's/States= *//' || true)
    echo "$name: still searching after $((now - start)) s, ${states:-few} states stored so far"
  fi
done
wait "$pan" || true
pan=
end=$(date +%s)
states=$(grep -o '[0-9]* states, stored' pan.log || echo "? states, stored")
memory=$(grep 'total actual memory usage' pan.log | awk '{print $1}')
times="$((end - start)) s: $((compiled - start)) s spin and gcc, $((end - compiled)) s pan, ${memory:-?} MB"
case $mode in
ok)
  if grep -q 'errors: 0' pan.log; then
    echo "$name: no violation ($states; $times)"
    exit 0
  fi
  cat pan.log
  echo "$name: the model found a violation, or the search did not finish ($times)"
  exit 1 ;;
hole)
  if grep -q 'errors: [1-9]' pan.log; then
    echo "$name: violation found, as it must ($(grep -o 'assertion violated.*(at' pan.log | sed 's/ (at$//'); $states; $times)"
    exit 0
  fi
  if grep -q 'errors: 0' pan.log; then
    echo "$name: no violation found, but the model must catch it ($states; $times)"
  else
    cat pan.log
    echo "$name: the check did not run"
  fi
  exit 1 ;;
esac
