"""pytest configuration for the oracle tests (tests/py): skips are visible, and fatal in CI.

A test skips when something it needs is absent (a fetched model, ../shared/testdata, the binary
when run outside ctest). When any test of a file skipped (and none failed), pytest exits with 77,
which CTest reports as "Skipped" (SKIP_RETURN_CODE, tests/CMakeLists.txt) instead of "Passed", as
for the C tests; ctest runs pytest with -rs, so the reasons are printed. Under DSP_TEST_REQUIRE=1 (scripts/test, i.e. CI, where
models and test data are always present) a skip is a failure, as in the C tests (tests/dsp_test.h),
except for tests that need a GPU (they use the `gpu` fixture): a machine without one skips them
whatever the setting, and CTest reports them as skipped.
"""
import os

import pytest

REQUIRE = os.environ.get("DSP_TEST_REQUIRE") == "1"
SKIP_EXIT_CODE = 77


def _reason(longrepr):
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if REQUIRE and rep.skipped and not hasattr(rep, "wasxfail") and "gpu" not in getattr(item, "fixturenames", ()):
        reason = _reason(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"skipped ({reason}), but DSP_TEST_REQUIRE=1 says everything it needs is present"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    rep = outcome.get_result()
    if REQUIRE and rep.skipped:  # a whole module skipped at import (pytest.importorskip, module-level skip)
        reason = _reason(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"skipped ({reason}), but DSP_TEST_REQUIRE=1 says everything it needs is present"


def pytest_sessionfinish(session, exitstatus):
    if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):  # 5: a module skipped whole
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is None:
        return
    if tr.stats.get("skipped"):
        session.exitstatus = SKIP_EXIT_CODE
