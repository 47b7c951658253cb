"""An SM100 stand-in for host checks on a CPU: FlashInfer 0.7.4's own wrapper code, run past its device probe.

There is no B200 here.  What 0.7.4 does on one before its kernels launch is plain host Python: the
routing of gated_delta_rule_mtp_ucache_flush (H19: _umma_unavailable_reason asks gdn_device_target
for the GPU's major) and the UMMA entry's checks after its device probe (heads_per_cta, stochastic
rounding, the seed, philox_rounds).  `standin(flush_module)` replaces only what answers "which GPU is
this" and what would launch:

* gdn_device_target, in the flush module and in the UMMA module its _UMMA comes from, returns an
  object with the stand-in's (major, minor) and 148 SMs (a B200's count);
* in the flush module, reading that object's num_sms (the first thing the HMMA path does after its
  device probe, H15) raises Reached("hmma"): the call passed every HMMA host check;
* the UMMA module's _get_kernel returns a function that raises Reached("umma") when called: its
  arguments are evaluated first (the fp32 cast of A_log and dt_bias among them), so the call passed
  every UMMA host check.

Everything else is the released code, unchanged.  The real device probe is restored on exit.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

from gdn_fuzz.properties import hostchecks as hc


class Reached(Exception):
    """The call passed every host check of this backend and would launch now."""

    def __init__(self, backend: str, kwargs: dict | None = None):
        super().__init__(f"reached the {backend} launch")
        self.backend = backend
        self.kwargs = kwargs or {}


@dataclass
class _Target:
    major: int
    minor: int
    stop_on_num_sms: bool

    @property
    def num_sms(self) -> int:
        if self.stop_on_num_sms:
            raise Reached("hmma")
        return 148

    @property
    def arch(self) -> str:
        return f"sm_{self.major}{self.minor}a"

    @property
    def compile_key(self) -> str:
        return f"standin-{self.arch}"


def umma_module_of(flush_module):
    """The module the flush wrapper's _UMMA function lives in (the package's gdn_replay_mtp_umma)."""
    fn = getattr(flush_module, "_UMMA", None)
    return None if fn is None else sys.modules[fn.__module__]


@contextlib.contextmanager
def standin(flush_module=None, umma_module=None, cc=(10, 0)):
    """Patch the device probe (and the launch) of the given modules for the block (module docstring)."""
    saved = []

    def patch(mod, name, value):
        saved.append((mod, name, getattr(mod, name)))
        setattr(mod, name, value)

    if umma_module is None and flush_module is not None:
        umma_module = umma_module_of(flush_module)
    if flush_module is not None:
        patch(flush_module, "gdn_device_target", lambda device: _Target(cc[0], cc[1], True))
    if umma_module is not None:
        patch(umma_module, "gdn_device_target", lambda device: _Target(cc[0], cc[1], False))

        def get_kernel(*args, **kw):
            def launch(*a, **k):
                raise Reached("umma")
            return launch

        patch(umma_module, "_get_kernel", get_kernel)
    try:
        yield
    finally:
        for mod, name, value in reversed(saved):
            setattr(mod, name, value)


def observe(fn, kw) -> hc.Observed:
    """observe_call for the stand-in: a call that reached a launch passed every host check; the
    backend it reached is kept in the message ('reached hmma' / 'reached umma')."""
    try:
        fn(**kw)
    except Reached as r:
        return hc.Observed(None, f"reached {r.backend}")
    except Exception as e:  # noqa: BLE001 - the exception is the observation
        return hc.Observed(type(e).__name__, str(e))
    return hc.Observed(None, "returned")


BACKEND_OF_ENTRY = {"flush": "hmma", "umma": "umma"}
