"""This project's own test settings.

The fixtures the suites use (target_under_test, gdn_selection, gdn_verdict) and the thread policy
are the gdn_fuzz pytest plugin's (gdn_fuzz/pytest_plugin.py), so a user's own test file gets them
too; the Hypothesis profiles load because pyproject.toml sets `gdn_fuzz_profiles = true`.
"""
