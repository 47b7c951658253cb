#!/usr/bin/env bash
# Shrink an offline bundle made by shared/gpu/make-offline-bundle.sh so that it and this repo's
# working tree fit the device tool's 64 MiB transfer cap together: drop nvidia-cutlass-dsl's
# `iket` package (In-Kernel Event Tracing, a profiler and its CLI; nothing imports it when the
# ReplaySSM kernel loads or JIT-compiles).  Used for runs 4-8 of docs/h200-results.md
# (66.0 MB -> 64.8 MB).  About 5 minutes (xz -9e).
#   bash tools/trim-bundle.sh .gpu/site.tar.xz
set -euo pipefail
B=${1:-.gpu/site.tar.xz}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
xz -d -T0 < "$B" | tar x -C "$work"
rm -rf "$work"/site/nvidia_cutlass_dsl/dsl_packages/iket
(cd "$work" && tar cf - site) | xz -9e -T2 > "$B.tmp"
mv "$B.tmp" "$B"
ls -l "$B"
