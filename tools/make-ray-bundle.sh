#!/usr/bin/env bash
# Build an offline bundle of Ray for the air-gapped H200 (CPython 3.12, x86-64): OUTDIR/site.tar.xz
# holding `site/` = ray (trimmed) and the packages it imports, for `gdn-fuzz run --ray` there.
#
#   tools/make-ray-bundle.sh OUTDIR        (default OUTDIR: .ray; add /.ray/ to .git/info/exclude)
#
# Ray's wheel is 79 MB, over the 64 MiB a device call may carry beside nothing else, so the parts a
# campaign never imports are left out: the Java jars, RLlib, Data, Serve, Train, Tune, the LLM
# libraries and the dashboard's web client (ray start runs with --include-dashboard false).
# On the GPU machine (after the FlashInfer bundle, in a second call that carries OUTDIR):
#   mkdir -p /tmp/ray && xz -d -T0 < OUTDIR/site.tar.xz | tar x -C /tmp/ray
#   export PYTHONPATH=/tmp/ray/site:$PYTHONPATH
set -euo pipefail
OUT=${1:-.ray}
RAY_VERSION=${RAY_VERSION:-2.60.0}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$work/whl" "ray==$RAY_VERSION"
mkdir -p "$work/site"
# unpacked with the file modes the wheels record (`python -m zipfile -e` drops them: raylet and
# gcs_server would not be executable, and `ray start` fails with "Permission denied")
python3 - "$work/site" "$work"/whl/*.whl <<'PY'
import os, sys, zipfile
site = sys.argv[1]
for whl in sys.argv[2:]:
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            path = z.extract(info, site)
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                os.chmod(path, mode)
PY
# what the GPU image has already (torch's), or a campaign never imports
rm -rf "$work"/site/ray/{jars,rllib,data,serve,train,tune,llm,dashboard/client} \
       "$work"/site/filelock* "$work"/site/typing_extensions* "$work"/site/*.dist-info/RECORD
(cd "$work" && tar c site | xz -9e -T0 > "$OUT/site.tar.xz")
ls -l "$OUT/site.tar.xz"
