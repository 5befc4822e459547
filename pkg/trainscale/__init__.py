"""trainscale: predict and explain how distributed training of large models scales.

The package is built in layers, each importing only those below it (``tests/test_layers.py`` reads the imports
and fails on one that runs up, or on a circle)::

    interface/   the CLI, the explore widgets, the docs/report, verify, the papermill engine, workflow outputs
    studies/     one module per scaling study: its datasets and paper-vs-ours records; the registry
    workloads/   the domain models behind single studies (curtailment, swarm, MPC, pruning, ...)
    training/    statistical efficiency: convergence, gradient compression, wall-clock time to a target loss
    model/       specs, catalogs, the performance model, calibration, validation, pipeline, search, ...
    common/      errors, checks, inputs, io, progress, plotting, comparison records, publishing
    kernels/     Numba kernels: arrays in, arrays out (no Python objects, no I/O)

The public API is here, imported on first use (``import trainscale`` stays cheap)::

    import trainscale
    trainscale.predict({"model": "llama2-7b", "system": "dgx-h100", "gpus": 16, "global_batch": 32})
    trainscale.search("llama2-7b", "dgx-h100", gpus=16, global_batch=32, top=3)

A module's old flat path (``trainscale.perfmodel``, ``from trainscale import specs``) still imports, with a
:class:`DeprecationWarning` naming its new place.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

# public name -> the module that defines it
_API = {
    "predict": "trainscale.model.perfmodel",
    "search": "trainscale.model.planner",
    "evaluate_grid": "trainscale.model.grid",
    "Prediction": "trainscale.model.perfmodel",
    "ModelSpec": "trainscale.model.specs",
    "SystemSpec": "trainscale.model.specs",
    "PlanSpec": "trainscale.model.specs",
    "RunSpec": "trainscale.model.specs",
    "resolve_model": "trainscale.model.specs",
    "resolve_system": "trainscale.model.specs",
    "SpecError": "trainscale.common.errors",
}

# a module's flat path before the layers (0.1.0) -> its layer
_MOVED = {
    **dict.fromkeys(["errors", "checks", "inputs", "io", "progress", "comparison", "plotting", "figurecheck",
                     "publish", "jitaside"], "common"),
    **dict.fromkeys(["specs", "catalog", "perfmodel", "pipeline", "calibration", "validation", "hetero", "inference",
                     "overlap", "sweep", "stackrules", "searchspace", "confidence", "scaling", "plancluster"], "model"),
    **dict.fromkeys(["convergence", "compression", "wallclock"], "training"),
    **dict.fromkeys(["chiplet", "curtailment", "gear", "jobprofile", "kernelmachines", "metarec", "mpc", "pruning",
                     "swarm"], "workloads"),
    "surveymap": "studies",
    **dict.fromkeys(["cli", "explore", "docs", "verify", "papermill_engine", "workflow_outputs"], "interface"),
}

__all__ = sorted(_API)


def _new_path(name: str) -> str:
    new = f"{__name__}.{_MOVED[name]}.{name}"
    warnings.warn(f"{__name__}.{name} moved to {new}; import it from there", DeprecationWarning, stacklevel=3)
    return new


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    if name in _MOVED:
        return importlib.import_module(_new_path(name))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API))


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``trainscale.<old flat name>`` as the module at its new path (the same module object)."""

    def find_spec(self, fullname, path=None, target=None):
        head, _, name = fullname.rpartition(".")
        if head != __name__ or name not in _MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        name = spec.name.rpartition(".")[2]
        module = importlib.import_module(_new_path(name))
        spec.loader_state = module.__spec__  # the import system sets the alias's spec on it next
        return module

    def exec_module(self, module):
        """Give the module its own spec back, so its relative imports still resolve from its new place."""
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())
