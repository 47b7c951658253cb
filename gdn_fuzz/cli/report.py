"""`gdn-fuzz report` (a campaign's Markdown/HTML report) and `gdn-fuzz doctor` (what this machine can run)."""

from __future__ import annotations

from gdn_fuzz.cli.commands import help_of
from gdn_fuzz.cli.common import EXIT_USAGE, console
from gdn_fuzz.engine.doctor import report
from gdn_fuzz.engine.report import ReportInputError, build


def cmd_report(args) -> int:
    try:
        path = build(args.records, args.campaign, args.out)
    except ReportInputError as e:
        console.print(f"gdn-fuzz report: {e}", markup=False, soft_wrap=True)
        return EXIT_USAGE
    console.print(f"report written: {path} (+ report.html and PNG plots beside it)")
    return 0


def cmd_doctor(args) -> int:
    console.print(report(), markup=False)
    return 0


def add_parser(sub) -> None:
    rep = sub.add_parser("report", help=help_of("report"))
    rep.add_argument("records", help="the campaign's --record JSON lines")
    rep.add_argument("--campaign", help="the campaign's --json record (findings, budget, versions)")
    rep.add_argument("--out", default="report", help="output folder")
    rep.set_defaults(func=cmd_report)
    d = sub.add_parser("doctor", help=help_of("doctor"))
    d.set_defaults(func=cmd_doctor)
