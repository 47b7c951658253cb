"""The pytest plugin: xdist GPU pinning, report header, options (pytester runs a child pytest)."""

from __future__ import annotations

import pytest

from gdn_fuzz import pytest_plugin

pytest_plugins = ["pytester"]


@pytest.mark.parametrize("worker, visible, want", [
    ("gw0", "4,5", "4"), ("gw1", "4,5", "5"), ("gw3", "4,5", "5"), ("gw2", "7", "7"), ("", "4,5", None),
])
def test_xdist_worker_gets_one_gpu(monkeypatch, worker, visible, want):
    """Worker gwN sees GPU N mod len(CUDA_VISIBLE_DEVICES); the controller (no worker id) is untouched."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.delenv("GDN_FUZZ_NO_GPU_PINNING", raising=False)
    assert pytest_plugin._pin_gpu_for_xdist_worker() == want


def test_pinning_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    monkeypatch.setenv("GDN_FUZZ_NO_GPU_PINNING", "1")
    assert pytest_plugin._pin_gpu_for_xdist_worker() is None


def test_report_header_names_target_device_and_corpus(pytester):
    """The header prints target, arms, device, torch, the Hypothesis profile and seed, and the corpus."""
    pytester.makepyfile("def test_x():\n    pass\n")
    res = pytester.runpytest("--gdn-target", "reference", "--gdn-arms", "bf16,fp16", "--gdn-device", "cpu",
                             "--gdn-corpus", str(pytester.path / "c"), "--hypothesis-seed", "5")
    res.stdout.fnmatch_lines(["gdn_fuzz: target=reference arms=bf16,fp16 device=cpu*hypothesis-seed=5*",
                              "gdn_fuzz: corpus=*c (0 entries*"])
    assert res.ret == 0


def test_bad_arm_option_is_a_clear_error(pytester):
    pytester.makepyfile("def test_x():\n    pass\n")
    res = pytester.runpytest("--gdn-arms", "bf32")
    assert res.ret != 0
    res.stderr.fnmatch_lines(["*--gdn-arms='bf32': arm='bf32' is not a legal dtype arm; use one of bf16*"])


KNOWN_TEST = '''
from gdn_fuzz.case import Case, Row
from gdn_fuzz.checks import check_launch
from gdn_fuzz.targets import get_target

FLUSH = Case(arm="bf16", T=4, H=1, HV=1, pool=1, rows=(Row(0, 13, 0),), seed=0)


def test_fold(gdn_verdict):
    t = get_target("mutant:fold_skipped")
    gdn_verdict("launch", FLUSH, check_launch(t, FLUSH), t.name)
'''


def test_known_bug_makes_a_property_test_an_xfail_naming_its_entry(pytester, tmp_path):
    """Only known signatures (open entries of the target) -> xfail naming the entry; with the entry
    gone the same test fails and its shrunk case is written as a new entry."""
    from gdn_fuzz.engine import corpus
    from gdn_fuzz.checks import check_launch
    from gdn_fuzz.case import Case, Row
    from gdn_fuzz.targets import get_target

    case = Case(arm="bf16", T=4, H=1, HV=1, pool=1, rows=(Row(0, 13, 0),), seed=0)
    t = get_target("mutant:fold_skipped")
    path, _ = corpus.write(corpus.make_entry("launch", case, check_launch(t, case), t.name), tmp_path / "known")
    pytester.makepyfile(test_known=KNOWN_TEST)
    res = pytester.runpytest("--gdn-corpus", str(tmp_path / "known"), "-rx", "-p", "no:cacheprovider")
    res.assert_outcomes(xfailed=1)
    res.stdout.fnmatch_lines([f"*known bug(s) only: oracle.fold [[]M7] out of tolerance (flush rows)*{path.name}*"])
    res = pytester.runpytest("--gdn-corpus", str(tmp_path / "empty"), "-p", "no:cacheprovider")
    res.assert_outcomes(failed=1)
    assert [corpus.read(p).signature for p in corpus.entries(tmp_path / "empty")] == [
        "oracle.fold [M7] out of tolerance (flush rows)"]


COUNTING_TEST = '''
from hypothesis import given, strategies as st

SEEN = []


@given(st.integers())
def test_count(x):
    SEEN.append(x)


def test_report():
    print("EXAMPLES", len(SEEN))
'''


def test_another_projects_hypothesis_settings_are_left_alone(pytester, monkeypatch):
    """Installed beside another project, the plugin loads no profile: that project's own test keeps
    Hypothesis' default 100 examples (it got 15 when the plugin loaded "dev" at import); a session
    that asks for gdn_fuzz (a --gdn-* option) gets the gdn_fuzz profile."""
    monkeypatch.delenv("GDN_FUZZ_PROFILE", raising=False)
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(test_other=COUNTING_TEST)
    res = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", "-p", "no:randomly")
    res.stdout.fnmatch_lines(["*EXAMPLES 100*"])
    res = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", "--gdn-target", "reference")
    res.stdout.fnmatch_lines(["*EXAMPLES 15*"])


def test_a_users_test_file_gets_the_fixtures_and_thread_policy(pytester, monkeypatch):
    """A project of its own (no conftest of gdn_fuzz's) gets target_under_test and the one-thread torch
    policy from the plugin in a gdn_fuzz session (a --gdn-* option): the fixture names the target chosen."""
    monkeypatch.delenv("GDN_FUZZ_TORCH_THREADS", raising=False)
    pytester.makepyfile(test_user='''
import torch


def test_uses_the_fixture(target_under_test):
    target, arms, device = target_under_test
    print("TARGET", target.name, ",".join(arms), device, "THREADS", torch.get_num_threads())
''')
    res = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", "--gdn-target", "reference",
                                        "--gdn-arms", "bf16", "--gdn-device", "cpu")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["*TARGET reference bf16 cpu THREADS 1*"])


def test_a_gdn_session_runs_one_campaign_process_per_run(pytester, monkeypatch):
    """The plugin sets GDN_FUZZ_PROCESSES=1 for a gdn_fuzz session (tests that start `gdn-fuzz run` would
    otherwise start four processes each on a 16-core GPU host), keeps a value the caller set, and
    restores the environment at the end of the session."""
    import os

    pytester.makeini("[pytest]\ngdn_fuzz_profiles = true\n")
    pytester.makepyfile("""
        import os
        def test_env():
            assert os.environ.get("GDN_FUZZ_PROCESSES") == os.environ.get("EXPECTED", "1")
    """)
    monkeypatch.delenv("GDN_FUZZ_PROCESSES", raising=False)
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert "GDN_FUZZ_PROCESSES" not in os.environ
    monkeypatch.setenv("GDN_FUZZ_PROCESSES", "3")
    monkeypatch.setenv("EXPECTED", "3")
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert os.environ["GDN_FUZZ_PROCESSES"] == "3"


GIVEN_VERDICT_TEST = '''
from hypothesis import HealthCheck, given, settings, strategies as st

from gdn_fuzz.case import Case, Row
from gdn_fuzz.checks import check_launch
from gdn_fuzz.targets import get_target


@given(seed=st.integers(0, 3))
{settings}
def test_launch(gdn_verdict, seed):
    case = Case(arm="bf16", T=4, H=1, HV=1, pool=1, rows=(Row(0, 3, 0),), seed=seed)
    t = get_target("reference")
    gdn_verdict("launch", case, check_launch(t, case), t.name)
'''


@pytest.mark.parametrize("with_setting", [False, True])
def test_gdn_verdict_in_a_hypothesis_test_needs_the_documented_setting(pytester, tmp_path, with_setting):
    """The README and the fixture's docstring say a @given test using gdn_verdict needs
    suppress_health_check=[HealthCheck.function_scoped_fixture]: without it Hypothesis stops the test with
    FailedHealthCheck, with it the test runs its examples and passes (the reference has no bug)."""
    pytester.makepyfile(test_given=GIVEN_VERDICT_TEST.format(
        settings="@settings(max_examples=3, suppress_health_check=[HealthCheck.function_scoped_fixture])"
        if with_setting else "@settings(max_examples=3)"))
    res = pytester.runpytest("--gdn-target", "reference", "--gdn-corpus", str(tmp_path / "c"), "-p", "no:cacheprovider")
    if with_setting:
        res.assert_outcomes(passed=1)
    else:
        res.assert_outcomes(failed=1)
        res.stdout.fnmatch_lines(["*FailedHealthCheck*function-scoped fixture*gdn_verdict*"])
