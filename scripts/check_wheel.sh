#!/usr/bin/env bash
# The product is the wheel: build it, install it with its core dependencies only (no [test] extra:
# no paddle, scipy, pytest, torch) into a fresh venv, and exercise it from a folder outside the
# checkout (scripts/wheel_smoke.py: every module imports, tvmgrad.run, `tvmgrad build` + load_library,
# Relax Gradient with tvmgrad's gradients).
#
# Usage: [PYTHON=python3] scripts/check_wheel.sh        (run from anywhere; exits non-zero on failure)
#   PYTHON     the interpreter that builds the wheel and makes the venv (default python3)
#   KEEP=1     keep the temp folder (wheel, venv, AOT library) and print where it is
#
# The wheel is built from a copy of the working tree's files that git does not ignore (tracked and
# untracked), so a stale build/ or egg-info in the checkout cannot leak into it. Kernels compile into
# a temp TVMGRAD_CACHE_DIR; everything is removed at the end.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/tvmgrad-wheel.XXXXXX")"
START=$SECONDS

cleanup() {
    if [[ "${KEEP:-0}" == 1 ]]; then echo "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

phase() { printf '[%4ds] %s\n' $((SECONDS - START)) "$*"; }
fail() { echo "check_wheel: FAILED: $*" >&2; exit 1; }

# -- 1. the wheel, from a clean copy of the source -----------------------------------------------
phase "copying the source tree"
mkdir -p "$TMP/src" "$TMP/dist" "$TMP/run" "$TMP/cache"
if git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done \
        | xargs -0 cp --parents -t "$TMP/src")
else
    (cd "$REPO" && tar --exclude=.venv --exclude=.git --exclude=build --exclude=dist \
        --exclude='*.egg-info' --exclude=__pycache__ --exclude=.cache -cf - .) | tar -xf - -C "$TMP/src"
fi

phase "building the wheel ($("$PYTHON" -V 2>&1))"
"$PYTHON" -m pip wheel --no-deps --quiet -w "$TMP/dist" "$TMP/src" >"$TMP/wheel.log" 2>&1 \
    || { cat "$TMP/wheel.log" >&2; fail "pip wheel"; }
WHEEL="$(ls "$TMP"/dist/tvmgrad-*.whl)" || fail "no wheel in $TMP/dist"
"$PYTHON" - "$WHEEL" <<'EOF' || fail "wheel contents"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for must in ("tvmgrad/relax/__init__.py", "tvmgrad/te_defs/__init__.py", "tvmgrad/schedules/cpu/__init__.py",
             "tvmgrad/schedules/cuda/__init__.py", "tvmgrad/specs/backward.yaml", "tvmgrad/examples/linalg.py"):
    assert must in names, f"{must} is not in the wheel"
stray = sorted({n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} - {"tvmgrad"})
assert not stray, f"top-level entries other than tvmgrad: {stray}"
print(f"  {sys.argv[1].rsplit('/', 1)[-1]}: {len(names)} files, {sum(n.endswith('.py') for n in names)} modules")
EOF

# -- 2. a fresh venv with the wheel and its core dependencies -----------------------------------
phase "installing it into a fresh venv (core dependencies only)"
"$PYTHON" -m venv "$TMP/venv"
VPY="$TMP/venv/bin/python"
"$VPY" -m pip install --quiet "$WHEEL" >"$TMP/install.log" 2>&1 || { cat "$TMP/install.log" >&2; fail "pip install"; }
"$VPY" -m pip list --format=freeze 2>/dev/null | grep -iE '^(apache-tvm|numpy|paddlepaddle|scipy|torch|pytest)=' \
    | sed 's/^/  /' || true

# -- 3. the smoke test, outside the checkout --------------------------------------------------------
phase "smoke test from $TMP/run"
cp "$REPO/scripts/wheel_smoke.py" "$TMP/wheel_smoke.py"
(
    cd "$TMP/run"
    unset PYTHONPATH
    export TVMGRAD_CACHE_DIR="$TMP/cache" PYTHONNOUSERSITE=1
    "$VPY" -I "$TMP/wheel_smoke.py" "$TMP/run"
) || fail "smoke test"

phase "wheel OK"
