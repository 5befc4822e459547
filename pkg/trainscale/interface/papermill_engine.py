"""A papermill engine whose kernels talk over CurveZMQ-encrypted sockets.

jupyter_client starts kernels over plain TCP unless its kernel manager is asked to provision CurveZMQ keys
(``transport_encryption``, off by default), and every kernel started that way logs "Kernel is running over TCP
without encryption" into each papermill run. This engine is papermill's own nbclient engine with a kernel
manager whose ``transport_encryption`` defaults to ``"auto"``: keys are provisioned where the kernelspec declares
support (ipykernel's ``python3`` does) and pyzmq has CurveZMQ, and the warning has nothing to report. Use it with
``papermill --engine trainscale ...`` (registered as a ``papermill.engine`` entry point in pyproject.toml).

It also refuses, before a kernel starts, a parameter the notebook does not take (``-p global_batch_token 1``:
papermill itself only warns "Passed unknown parameter" and runs the defaults), with one line naming it and
the notebook's parameters. The study notebooks check again inside (``check_notebook_parameters``), so plain
``papermill`` refuses it too, after the imports.
"""

from __future__ import annotations

import ast

import click
from jupyter_client.manager import AsyncKernelManager
from papermill.engines import NBClientEngine
from traitlets import default

__all__ = ["EncryptedKernelManager", "TrainscaleEngine", "UnknownParameterError", "notebook_parameter_names",
           "check_injected_parameters"]


class UnknownParameterError(click.UsageError):
    """A parameter the notebook does not take (papermill's command line prints the one line and exits 2)."""


def notebook_parameter_names(nb) -> set[str] | None:
    """The names assigned in the notebook's cell tagged ``parameters`` (None when it has no such cell)."""
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            try:
                tree = ast.parse(cell.source)
            except SyntaxError:
                return None
            return {target.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                    for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                    if isinstance(target, ast.Name)}
    return None


def check_injected_parameters(nb) -> None:
    """Raise UnknownParameterError for a parameter papermill injected that the notebook does not define."""
    injected = set(nb.get("metadata", {}).get("papermill", {}).get("parameters", {}) or {})
    known = notebook_parameter_names(nb)
    if not injected or known is None:
        return
    unknown = sorted(injected - known)
    if unknown:
        raise UnknownParameterError(f"notebook parameter {unknown[0]}: unknown; this notebook takes "
                                    f"{', '.join(sorted(known))}")


class EncryptedKernelManager(AsyncKernelManager):
    """An async kernel manager that provisions CurveZMQ keys when the kernel supports them, and shuts an idle
    kernel down without first interrupting it.

    jupyter_client sends SIGINT before every shutdown_request; papermill shuts the kernel down after its last
    cell, when it is idle, and a kernel still handling a late message then logs "[IPKernelApp] ERROR |
    KeyboardInterrupt caught in kernel." into a run that succeeded (seen in ``make figures-quick``). The
    shutdown_request alone ends an idle kernel; a kernel that does not end is still sent SIGTERM and then
    SIGKILL (``shutdown_wait_time``). An interrupt asked for explicitly (a cell's timeout) is unchanged."""

    @default("transport_encryption")
    def _default_transport_encryption(self) -> str:
        return "auto"

    async def _async_interrupt_kernel(self) -> None:
        if self.shutting_down:
            return
        await super()._async_interrupt_kernel()


class TrainscaleEngine(NBClientEngine):
    """papermill's nbclient engine with :class:`EncryptedKernelManager`."""

    @classmethod
    def execute_notebook(cls, nb, kernel_name, **kwargs):
        check_injected_parameters(nb)
        return super().execute_notebook(nb, kernel_name, **kwargs)

    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, **kwargs):
        kwargs.setdefault("kernel_manager_class", EncryptedKernelManager)
        return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)
