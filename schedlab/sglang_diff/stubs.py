"""Stand-ins for SGLang's GPU-only imports, so that its scheduler imports on a CPU.

SGLang 0.5.23 imports ``sgl_kernel`` (CUDA kernels), ``triton`` and ``torchvision`` at module
level in code the scheduler pulls in, though scheduling never calls them. Its own CPU unit tests
stub ``sgl_kernel`` the same way (``sglang.test.test_utils.maybe_stub_sgl_kernel``: a meta-path
finder whose modules answer every attribute with a ``MagicMock``); that helper cannot be used
here because importing ``sglang.test.test_utils`` already needs the packages it stubs.

torch's compiler modules are imported *before* the ``triton`` stub is installed: they probe
``triton`` at import time (``torch.utils.flop_counter`` checks ``isinstance(x, JITFunction)``)
and a mock there breaks them. ``triton.runtime.driver.active.get_current_target()`` raises, as
it does on a host without a GPU, so SGLang's FLA helpers fall back to the CPU.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from unittest.mock import MagicMock

STUBBED = ("sgl_kernel", "triton", "torchvision")


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__getattr__ = lambda name: MagicMock()
        if module.__name__ in ("triton", "triton.runtime"):  # no GPU: the driver query fails
            driver = MagicMock()
            driver.active.get_current_target.side_effect = RuntimeError("no GPU")
            if module.__name__ == "triton":
                module.runtime = MagicMock(driver=driver)
            else:
                module.driver = driver


class _StubFinder(importlib.abc.MetaPathFinder):
    def __init__(self, names):
        self.names = tuple(names)

    def find_spec(self, fullname, path, target=None):
        if any(fullname == n or fullname.startswith(n + ".") for n in self.names):
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)
        return None


def install() -> None:
    """Stub :data:`STUBBED` (idempotent). On a CPU none of them works: ``sgl_kernel`` needs CUDA,
    PyPI's ``torchvision`` does not load beside the CPU build of torch."""
    if any(isinstance(f, _StubFinder) for f in sys.meta_path):
        return
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  -- the compiler stack, before the triton stub
    import torch._functorch.aot_autograd  # noqa: F401
    import torch._inductor  # noqa: F401
    import torch.utils.flop_counter  # noqa: F401

    sys.meta_path.insert(0, _StubFinder(STUBBED))
