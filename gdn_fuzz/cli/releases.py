"""`gdn-fuzz release list|fetch` (the modelled FlashInfer releases and their files) and `gdn-fuzz diff OLD NEW`
(gdn_fuzz.studies.release_diff)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.table import Table

from gdn_fuzz.cli.commands import help_of
from gdn_fuzz.arms import parse_arms
from gdn_fuzz.cli.common import EXIT_NEW, EXIT_OK, EXIT_USAGE, console
from gdn_fuzz.studies import release_diff
from gdn_fuzz.targets import TargetMismatch, TargetUnavailable, releases


def cmd_release(args) -> int:
    if args.action == "fetch":
        for v in args.versions or [releases.DEFAULT.version]:
            if v not in releases.RELEASES:
                console.print(f"[red]release fetch {v}:[/red] no model for {v}; modelled releases: "
                              f"{', '.join(releases.RELEASES)}")
                return EXIT_USAGE
            try:
                where = releases.fetch(v, Path(args.dest) if args.dest else None)
            except releases.ReleaseFileError as e:
                console.print(f"[red]release fetch {v}:[/red] {e}")
                return EXIT_USAGE
            console.print(f"flashinfer-python {v}: {where}")
        return EXIT_OK
    tab = Table(title="modelled FlashInfer releases (gdn_fuzz.targets.releases)")
    for col in ("release", "entry points", "backends", "file here"):
        tab.add_column(col)
    installed = releases.installed_version()
    for v, r in releases.RELEASES.items():
        try:
            here = str(releases.release_file(v)) + (" (installed)" if v == installed else "")
        except (TargetUnavailable, releases.ReleaseFileError) as e:
            here = f"no: {str(e).split(';')[-1].strip()}"
        tab.add_row(v + (" (default)" if r is releases.DEFAULT else ""), ", ".join(r.entries),
                    ", ".join(b.name for b in r.backends), here)
    console.print(tab)
    console.print(f"installed flashinfer-python: {installed or 'none'}")
    return EXIT_OK


def cmd_diff(args) -> int:
    try:
        old, new = release_diff.resolve(args.old), release_diff.resolve(args.new)
        for t in (old, new):
            t.module(t.release.release.entry(t.model_entry).arms[0])
    except (TargetUnavailable, TargetMismatch, ValueError, ImportError) as e:
        console.print(f"[red]diff {args.old} {args.new}:[/red] {e}")
        return EXIT_USAGE
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    host_device = args.host_device or device
    arms = parse_arms(args.arms) if args.arms else None
    t0 = time.monotonic()
    host = release_diff.host_check_diff(old, new, host_device, arms)
    console.print(f"host checks: {host['probes']} calls on {host_device} tensors in {time.monotonic() - t0:.0f} s, "
                  f"{len(host['rows'])} rows differ")
    launches = None
    why = old.unavailable_reason(device) or new.unavailable_reason(device)
    if args.examples > 0 and why is None:
        launches = release_diff.launch_diff(old, new, device, args.examples, arms, tuple(args.T), args.seed)
    elif why:
        console.print(f"launches: not run ({why})")
    text = release_diff.markdown(old, new, host, launches, host_device)
    console.print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(
            date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), old=dict(name=old.name, path=str(old.path),
            model=str(old.release)), new=dict(name=new.name, path=str(new.path), model=str(new.release)),
            **release_diff.to_json(host, launches)), indent=1, default=str))
    differs = launches is not None and any(c.get("different", 0) for c in launches["counts"].values())
    return EXIT_NEW if differs else EXIT_OK


def add_parser(sub) -> None:
    r = sub.add_parser("release", help=help_of("release"))
    r.add_argument("action", choices=["list", "fetch"], nargs="?", default="list")
    r.add_argument("versions", nargs="*", help="releases to fetch (default: the default release)")
    r.add_argument("--dest", help=f"folder for fetched releases (default {releases.cache_dir()})")
    r.set_defaults(func=cmd_release)
    d = sub.add_parser("diff", help=help_of("diff"))
    d.add_argument("old")
    d.add_argument("new")
    d.add_argument("--device", help="device of the launches (default: cuda when available)")
    d.add_argument("--host-device", help="device of the host-check calls' tensors (default: --device)")
    d.add_argument("--examples", type=int, default=50, help="drawn launches (0: host checks only)")
    d.add_argument("--arms", nargs="+", help="arms of the host-check calls and the launches (default: every arm)")
    d.add_argument("--T", nargs="+", type=int, default=[4, 8], choices=[4, 8])
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--json")
    d.add_argument("--markdown")
    d.set_defaults(func=cmd_diff)
