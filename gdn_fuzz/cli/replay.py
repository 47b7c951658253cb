"""`gdn-fuzz replay`: re-run corpus entries (gdn_fuzz.engine.corpus), explain them, emit a reproducer test."""

from __future__ import annotations

import os

from rich.table import Table

from gdn_fuzz.cli.commands import help_of
from gdn_fuzz.cli.common import EXIT_USAGE, console, default_device
from gdn_fuzz.engine import corpus
from gdn_fuzz.engine.reproducer import emit_test, entry_launch, explain
from gdn_fuzz.targets import TargetUnavailable, get_target


def cmd_replay(args) -> int:
    paths = [p for a in (args.entries or [str(corpus.default_dir())]) for p in
             (corpus.entries(a) if os.path.isdir(a) else [a])]
    if args.emit_test:
        if len(paths) != 1:
            console.print(f"[red]gdn-fuzz replay --emit-test:[/red] give exactly one corpus entry file (got "
                          f"{len(paths)})", markup=True)
            return EXIT_USAGE
        try:
            e = corpus.read(paths[0])
            emit_test(e, args.emit_test, target=args.target)
        except (corpus.CorpusError, ValueError, OSError) as err:
            console.print(f"[red]gdn-fuzz replay --emit-test:[/red] {err}", markup=True)
            return EXIT_USAGE
        console.print(f"reproducer written: {args.emit_test} (fails while {e.signature!r} shows on "
                      f"{args.target or e.target}; run it with pytest)", markup=False)
        console.print("the launch that failed:\n" + entry_launch(e).describe(), markup=False)
    t = Table(title="gdn-fuzz replay")
    for col in ("entry", "status", "target", "property", "result", "detail"):
        t.add_column(col, overflow="fold")
    unexpected = 0
    explained = []
    for p in paths:
        try:
            e = corpus.read(p)
        except corpus.CorpusError as err:
            t.add_row(str(p), "-", "-", "-", "[red]unreadable[/red]", str(err))
            unexpected += 1
            continue
        target = args.target or e.target
        try:
            if not args.target:
                corpus.check_replayable(e, args.allow_target_paths or None)
            tgt = get_target(target)
            why = tgt.unavailable_reason(args.device or default_device(tgt))
        except corpus.CorpusError as err:  # an entry naming a file: refused, not skipped
            t.add_row(str(p), e.status, target, e.prop, "[red]refused[/red]", str(err))
            unexpected += 1
            continue
        except (TargetUnavailable, ValueError) as err:
            why = str(err)
        if why:
            t.add_row(str(p), e.status, target, e.prop, "skipped", why)
            continue
        device = args.device or default_device(tgt)
        found = corpus.replay(e, target, device, allow_paths=True)
        ok, what = corpus.verdict(e, found)
        if args.explain:
            text = (explain(e.prop, e.case, found, e.signature, tgt, device, isolate=corpus.is_crash(e))
                    if any(f.launch for f in found) else entry_launch(e).describe())
            explained.append(f"{p}: {e.signature}\n{text}")
        unexpected += not ok
        res = what if ok else f"[red]{what}[/red]"
        t.add_row(str(p), e.status, target, e.prop, res, "; ".join(str(f) for f in found)[:300])
    console.print(t)
    for text in explained:
        console.print(text, markup=False)
    return 1 if unexpected else 0


def cmd_corpus_check(args) -> int:
    """`gdn-fuzz corpus check [FOLDER...]`: read every entry as replay and run would (format, every field of its
    case checked against its bounds, status); one line per entry that is refused, exit 1 if any, else 0.  Runs
    nothing: no target is loaded and no case is materialized."""
    folders = args.folders or [str(corpus.default_dir())]
    for f in folders:
        if not os.path.isdir(f):
            console.print(f"gdn-fuzz corpus check: {f!r} is not a folder; give corpus folders (default: "
                          f"{corpus.default_dir()})", markup=False, soft_wrap=True)
            return EXIT_USAGE
    bad = [why for f in folders for why in corpus.unreadable(f)]
    n = sum(len(corpus.entries(f)) for f in folders)
    for why in bad:
        console.print(why, markup=False, soft_wrap=True)
    console.print(f"{n} entries read in {', '.join(folders)}: {n - len(bad)} valid, {len(bad)} refused", markup=False)
    return 1 if bad else 0


def add_parser(sub) -> None:
    cp = sub.add_parser("corpus", help=help_of("corpus"))
    csub = cp.add_subparsers(dest="corpus_cmd", required=True)
    ck = csub.add_parser("check", help="read every entry as replay and run do; name each refused one (exit 1)")
    ck.add_argument("folders", nargs="*", help="corpus folders (default: $GDN_FUZZ_CORPUS or ./corpus)")
    ck.set_defaults(func=cmd_corpus_check)
    rp = sub.add_parser("replay", help=help_of("replay"))
    rp.add_argument("entries", nargs="*", help="entry files or folders (default: the corpus folder)")
    rp.add_argument("--target", help="replay against this target instead of each entry's own")
    rp.add_argument("--device")
    rp.add_argument("--allow-target-paths", action="store_true",
                    help="replay entries whose target is a file path (imports and runs that file; "
                         "never use on entries you did not write)")
    rp.add_argument("--explain", action="store_true",
                    help="after the table, print each entry's launch (the Case as it ran and the transformation of "
                         "its inputs) and, for a launch-property oracle finding on a routing or ring edge, which "
                         "neighbouring cursors (P +/- 1, base +/- 1) pass")
    rp.add_argument("--emit-test", metavar="PATH",
                    help="write a standalone pytest file reproducing the one ENTRY given (its launch as a Case "
                         "literal, the property's check, and an assertion that the entry's signature is gone: it "
                         "fails while the bug is present), then replay it as usual")
    rp.set_defaults(func=cmd_replay)
