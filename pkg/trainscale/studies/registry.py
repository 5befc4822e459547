"""The study registry: what the workflow, the config check, ``trainscale verify`` and the README gallery
know about each study, read from the study's own module.

A study is declared by four things: its module ``trainscale.studies.<name_with_underscores>``, its notebook
``notebooks/<name>.ipynb``, its block in ``config/config.yaml`` (``studies: <name>: {full: ..., quick: ...}``,
with the parameters' schema under ``$defs/params/<name>`` in ``config/schema.yaml``) and its test. The module
declares

* ``PAPER``: the short citation of the paper it compares with;
* ``OUTPUTS``: the files its notebook writes in ``output_dir`` (datasets and figures);
* ``RESOURCES``: ``mem_mb``, ``runtime_quick_min``, ``runtime_full_min`` (for a SLURM profile);
* optionally ``INPUT_FOLDER_PARAMETERS``: parameters naming folders whose ``*.csv`` files are inputs;
* optionally ``MEASURED``: those of ``OUTPUTS`` that hold wall-clock timings of the machine that ran it
  (distributed-mpc's speed-ups are measured side by side in one run, as its paper's are): they differ from run
  to run, so the byte-identical rerun test leaves them out; every other output regenerates byte for byte;
* ``compare(folder)``: its paper-vs-ours records (:mod:`trainscale.common.comparison`) from the saved datasets;
* ``FIGURES`` (if it has figures): ``{file name: draw(folder) -> matplotlib Figure}`` for every PNG of its
  ``OUTPUTS``, each drawn from the saved datasets alone (the notebook saves what it returns): ``trainscale verify``
  redraws each from the committed datasets, checks it (:mod:`trainscale.common.figurecheck`) and that the committed PNG
  is its bytes. A figure drawn only in the notebook is refused: it could show what no saved dataset holds.

From these, ``workflow/rules/studies.smk`` generates one rule per study (outputs: ``OUTPUTS`` plus
``comparison.csv``), :func:`validate_config` checks each study's parameters against its schema, and
``trainscale verify`` / ``trainscale gallery`` read the records.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping

from ..common.comparison import RECORDS_FILE

__all__ = ["StudyInfo", "module_name", "load", "load_all", "validate_config", "check_notebook_parameters",
           "ConfigError", "injected_parameter_names"]

REQUIRED = ("PAPER", "OUTPUTS", "RESOURCES", "compare")
RESOURCE_KEYS = ("mem_mb", "runtime_quick_min", "runtime_full_min")


class ConfigError(ValueError):
    """A study's declaration or parameters are invalid; the message is one line naming what and where."""


@dataclass(frozen=True)
class StudyInfo:
    name: str
    module: ModuleType
    paper: str
    outputs: tuple[str, ...]
    resources: Mapping[str, int]
    input_folder_parameters: tuple[str, ...]
    measured: tuple[str, ...] = ()
    figures: Mapping[str, Callable] = None

    def __post_init__(self):
        if self.figures is None:
            object.__setattr__(self, "figures", {})

    @property
    def notebook(self) -> str:
        return f"notebooks/{self.name}.ipynb"

    @property
    def rule(self) -> str:
        return self.name.replace("-", "_")

    @property
    def compare(self) -> Callable:
        return self.module.compare

    def all_outputs(self) -> list[str]:
        """The rule's outputs: the declared files and the comparison record."""
        return [*self.outputs, RECORDS_FILE]


def module_name(study: str) -> str:
    """'hardware-scaling' -> 'trainscale.studies.hardware_scaling'."""
    return f"{__package__}.{study.replace('-', '_')}"


def load(study: str) -> StudyInfo:
    """The registry entry of one study, from its module; ConfigError if the module is missing or incomplete."""
    name = module_name(study)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name != name:
            raise
        raise ConfigError(f"study {study!r}: no module {name} (each study in config/config.yaml needs "
                          f"pkg/trainscale/studies/{study.replace('-', '_')}.py)") from None
    missing = [attr for attr in REQUIRED if not hasattr(module, attr)]
    if missing:
        raise ConfigError(f"study {study!r}: module {name} lacks {', '.join(missing)} "
                          f"(see trainscale.studies.registry)")
    outputs = tuple(module.OUTPUTS)
    if not outputs or any(not isinstance(o, str) or "/" in o or o == RECORDS_FILE for o in outputs):
        raise ConfigError(f"study {study!r}: OUTPUTS = {outputs!r} must be file names in output_dir "
                          f"(not {RECORDS_FILE}, which every study writes)")
    resources = dict(module.RESOURCES)
    if sorted(resources) != sorted(RESOURCE_KEYS) or any(
            not isinstance(v, int) or v < 1 for v in resources.values()):
        raise ConfigError(f"study {study!r}: RESOURCES = {resources!r} must give positive integers for "
                          f"{', '.join(RESOURCE_KEYS)}")
    folders = tuple(getattr(module, "INPUT_FOLDER_PARAMETERS", ()))
    measured = tuple(getattr(module, "MEASURED", ()))
    if any(m not in outputs for m in measured):
        raise ConfigError(f"study {study!r}: MEASURED = {measured!r} must be among its OUTPUTS")
    figures = dict(getattr(module, "FIGURES", {}))
    if any(name not in outputs or not name.endswith(".png") or not callable(draw) for name, draw in figures.items()):
        raise ConfigError(f"study {study!r}: FIGURES = {sorted(figures)!r} must map PNG files of its OUTPUTS to "
                          f"functions of the output folder")
    undrawn = sorted(name for name in outputs if name.endswith(".png") and name not in figures)
    if undrawn:
        raise ConfigError(f"study {study!r}: figures {undrawn!r} of its OUTPUTS are not in FIGURES; declare a "
                          f"function that draws each from the saved datasets (trainscale verify redraws it)")
    return StudyInfo(study, module, str(module.PAPER), outputs, resources, folders, measured, figures)


def load_all(studies) -> list[StudyInfo]:
    """Registry entries of the given study names (e.g. ``config["studies"]``), in that order."""
    return [load(study) for study in studies]


def _where(path) -> str:
    return ".".join(str(p) for p in path)


def validate_config(config: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    """Check every study's full and quick parameters against ``$defs/params/<study>`` of the schema.

    The schema's top level checks the shape (``studies: <name>: {full, quick}``); this adds, per study, the
    exact parameter check. Raises ConfigError with one line: the study, mode, field, value and what is valid.
    """
    from jsonschema import Draft202012Validator

    params = schema.get("$defs", {}).get("params", {})
    for study, modes in config.get("studies", {}).items():
        if study not in params:
            raise ConfigError(f"studies.{study}: config/schema.yaml has no $defs/params/{study} describing "
                              f"its parameters (known: {', '.join(sorted(params))})")
        subschema = {"$defs": schema["$defs"], "$ref": f"#/$defs/params/{study}"}
        validator = Draft202012Validator(subschema)
        for mode, values in modes.items():
            problem = _first_error(validator, values)
            if problem:
                raise ConfigError(f"config: studies.{study}.{mode}.{problem[0] or '(parameters)'}: {problem[1]}")


def _first_error(validator, values) -> tuple[str, str] | None:
    """(field, message) of the first schema violation of one parameter set, or None."""
    errors = sorted(validator.iter_errors(values), key=lambda e: list(e.path))
    if not errors:
        return None
    err = errors[0]
    field, message = _where(err.path), err.message
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        known = sorted(err.schema.get("properties", {}))
        unknown = sorted(set(err.instance) - set(known))
        field = ".".join(filter(None, [field, unknown[0] if unknown else ""]))
        message = f"unknown parameter; valid: {', '.join(known)}"
    return field, message if len(message) <= 300 else message[:297] + "..."


# Parameters every study notebook takes besides its config block (the workflow sets it).
NOTEBOOK_ONLY_PARAMETERS = frozenset({"output_dir"})
# The first line papermill writes in the cell of the parameters it injects (papermill.translators).
_INJECTED_HEADER = "# Parameters"


def injected_parameter_names(namespace: Mapping[str, Any]) -> set[str]:
    """The names papermill injected into a running notebook (``-p NAME VALUE``, ``-y``, ``-f``), read from
    the kernel's input history ``In`` (the injected cell starts with ``# Parameters``); empty when nothing
    was injected (JupyterLab) or there is no history."""
    history = namespace.get("In")
    if not isinstance(history, list):
        return set()
    for source in reversed(history):
        if isinstance(source, str) and source.splitlines()[:1] == [_INJECTED_HEADER]:
            try:
                tree = ast.parse(source)
            except SyntaxError:
                return set()
            return {target.id for node in tree.body if isinstance(node, ast.Assign)
                    for target in node.targets if isinstance(target, ast.Name)}
    return set()


def check_notebook_parameters(study: str, namespace: Mapping[str, Any],
                              schema_path: str | Path = "config/schema.yaml") -> None:
    """A study notebook's parameters (as papermill or a user set them) against the same schema the workflow's
    config is checked with (``$defs/params/<study>``): a name the study does not take (``papermill -p
    global_batch_token ...``, which papermill only warns about) or a value of the wrong type or out of range
    raises ConfigError with one line naming the parameter and what is valid (``papermill -p
    include_vtrain_single badvalue`` is not taken as true). Call it in the notebook's first code cell with ``globals()``."""
    from jsonschema import Draft202012Validator

    path = Path(schema_path)
    if not path.is_file():  # outside the repository (a copied notebook): nothing to check against
        return
    schema = schema_from_file(path)
    params = schema.get("$defs", {}).get("params", {})
    if study not in params:
        raise ConfigError(f"study {study!r}: {path} has no $defs/params/{study}")
    names = set(params[study].get("properties", {}))
    unknown = sorted(injected_parameter_names(namespace) - names - NOTEBOOK_ONLY_PARAMETERS)
    if unknown:
        valid = ", ".join(sorted(names | NOTEBOOK_ONLY_PARAMETERS))
        raise ConfigError(f"notebook parameter {unknown[0]}: unknown parameter of {study}; valid: {valid}")
    values = {name: namespace[name] for name in names if name in namespace}
    validator = Draft202012Validator({"$defs": schema["$defs"], "$ref": f"#/$defs/params/{study}"})
    problem = _first_error(validator, values)
    if problem and problem[0]:
        raise ConfigError(f"notebook parameter {problem[0]}: {problem[1]}")
    missing = sorted(set(params[study].get("required", ())) - set(values))
    if missing:
        raise ConfigError(f"notebook parameter {missing[0]}: missing (the notebook's parameters cell defines it)")


def schema_from_file(path: str | Path) -> dict:
    import yaml

    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
