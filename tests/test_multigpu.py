"""`gdn-fuzz run --gpus`: one worker process per GPU, one shared corpus, one merged record.

On a GPU host the workers run the GPU campaign (docs/h200-results.md records the two-GPU run).
Here, without a GPU, the same orchestration runs two CPU workers (`--device cpu`): it proves the
assignment (each worker sees only its own CUDA_VISIBLE_DEVICES value, its own seed) and that two
workers finding the same planted bug write one whole corpus entry and lose none.
"""

from __future__ import annotations

import argparse
import json

import pytest

from gdn_fuzz.engine import corpus
from gdn_fuzz.cli import main
from gdn_fuzz.engine.multigpu import child_argv, parse_gpus, threads_per_worker


def test_parse_gpus():
    assert parse_gpus("0,1") == ["0", "1"]
    assert parse_gpus(" 3 ") == ["3"]
    for bad in ("", "0,0", "a,b", "0;1"):
        with pytest.raises(ValueError, match="--gpus"):
            parse_gpus(bad)


def test_child_argv_keeps_the_options():
    args = argparse.Namespace(device=None, seed=5, round_examples=25, target="production", arms=["bf16"], T=[4],
                              buckets=[4, 8], seconds=30.0, examples=None, property=["launch"], no_isolate=False)
    argv = child_argv(args, 1, "/x/c.gpu1.json", None, "/x/corpus")
    s = " ".join(argv)
    assert "--seed 6" in s and "--device cuda" in s and "--target production" in s and "--seconds 30.0" in s
    assert "--corpus /x/corpus" in s and "--property launch" in s and "--gpus" not in s


def test_workers_split_the_host_cores():
    """--gpus without --torch-threads: each worker gets cores / workers torch threads (at least 1), and
    child_argv carries the count; an explicit --torch-threads is kept."""
    assert [threads_per_worker(n, 16) for n in (1, 2, 4, 8, 32)] == [16, 8, 4, 2, 1]
    args = argparse.Namespace(device=None, seed=0, round_examples=25, target=None, arms=None, T=[4], buckets=[4],
                              seconds=1.0, examples=None, property=None, no_isolate=False, torch_threads=3)
    assert "--torch-threads 3" in " ".join(child_argv(args, 0, "/x/c.json", None, None))


def test_two_workers_share_one_corpus(tmp_path):
    cdir, jp = tmp_path / "corpus", tmp_path / "camp.json"
    rc = main(["run", "--gpus", "0,1", "--device", "cpu", "--target", "mutant:fold_skipped", "--arms", "bf16",
               "--T", "4", "--examples", "25", "--property", "launch", "--no-isolate", "--corpus", str(cdir),
               "--json", str(jp)])
    assert rc == 1  # the planted bug is found
    rec = json.loads(jp.read_text())
    assert rec["failed"] == [] and [w["gpu"] for w in rec["workers"]] == ["0", "1"]
    assert [w["cuda_visible_devices"] for w in rec["workers"]] == ["0", "1"]
    assert [w["seed"] for w in rec["workers"]] == [0, 1]
    assert all(w["findings"] for w in rec["workers"]), "each worker finds the planted bug"
    stored = {p.name: corpus.read(p) for p in corpus.entries(cdir)}  # every entry whole and readable
    reported = [f["corpus_entry"] for w in rec["workers"] for f in w["findings"]]
    assert None not in reported and set(stored) == set(reported)  # nothing lost, nothing extra
    # the entry is named by the failure's identity, so the same failure from both workers is one file
    for name, e in stored.items():
        assert name == e.filename()
    assert rec["totals"]["examples"] == sum(w["examples"] for w in rec["workers"])


def test_every_run_option_reaches_the_workers():
    """A new `gdn-fuzz run` option must be carried by child_argv (or consumed by the parent)."""
    from gdn_fuzz.cli import build_parser
    from gdn_fuzz.engine.multigpu import HANDLED_RUN_OPTIONS

    sub = next(a for a in build_parser()._actions if a.dest == "cmd").choices["run"]
    dests = {a.dest for a in sub._actions if a.dest != "help"}
    assert dests == HANDLED_RUN_OPTIONS, f"not carried by --gpus: {dests - HANDLED_RUN_OPTIONS}"
