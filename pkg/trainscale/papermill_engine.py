"""A papermill engine whose kernels talk over CurveZMQ-encrypted sockets.

jupyter_client starts kernels over plain TCP unless its kernel manager is asked to provision CurveZMQ keys
(``transport_encryption``, off by default), and every kernel started that way logs "Kernel is running over TCP
without encryption" into each papermill run. This engine is papermill's own nbclient engine with a kernel
manager whose ``transport_encryption`` defaults to ``"auto"``: keys are provisioned where the kernelspec declares
support (ipykernel's ``python3`` does) and pyzmq has CurveZMQ, and the warning has nothing to report. Use it with
``papermill --engine trainscale ...`` (registered as a ``papermill.engine`` entry point in pyproject.toml).
"""

from __future__ import annotations

from jupyter_client.manager import AsyncKernelManager
from papermill.engines import NBClientEngine
from traitlets import default

__all__ = ["EncryptedKernelManager", "TrainscaleEngine"]


class EncryptedKernelManager(AsyncKernelManager):
    """An async kernel manager that provisions CurveZMQ keys when the kernel supports them."""

    @default("transport_encryption")
    def _default_transport_encryption(self) -> str:
        return "auto"


class TrainscaleEngine(NBClientEngine):
    """papermill's nbclient engine with :class:`EncryptedKernelManager`."""

    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, **kwargs):
        kwargs.setdefault("kernel_manager_class", EncryptedKernelManager)
        return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)
