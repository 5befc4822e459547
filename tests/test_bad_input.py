"""Every bad input issue 12 lists ends in one line and exit 2 (or a result with a one-line warning),
never a traceback, a hang or a silent null (issue 12, parts 6 and 7). One regression test per case,
run through the CLI as a user would (in-process), plus the shared layer (trainscale.common.inputs)."""

import contextlib
import io
import json
import signal
import sys

import nbformat
import pytest
import yaml

from trainscale.common import inputs
from trainscale.model import perfmodel
from trainscale.interface.cli import main
from trainscale.model.specs import SpecError

CASE_SECONDS = 20

RUN = {"id": "r", "model": "llama2-7b", "system": "dgx-h100", "gpus": 64, "plan": {"tp": 8, "global_batch": 64}}
GROUPS = [{"name": "a", "system": "dgx-a100-80gb", "nodes": 2}, {"name": "b", "system": "dgx-v100", "nodes": 2}]
LINK = {"between": ["a", "b"], "bandwidth_GBps": 12.5, "latency_s": 1e-5}
SHAPE = {"name": "m", "layers": 32, "hidden": 4096, "heads": 32, "vocab": 32000, "seq_len": 4096, "ffn_type": "swiglu"}


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def cli(argv, capsys):
    """(exit status, stdout, stderr) of the CLI; a case past CASE_SECONDS fails as a hang."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        code = main([str(a) for a in argv])
    except Hang:
        pytest.fail(f"hang (> {CASE_SECONDS} s): {argv}")
    except SystemExit as exc:
        code = exc.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module", autouse=True)
def compiled_plan_kernels(tmp_path_factory):
    """Run one valid ``plan``, ``predict`` and ``search`` first, so that a cold Numba cache (a fresh clone)
    compiles their kernels before any case's CASE_SECONDS starts: the guard times the case's own work, not the
    one-off compilation (minutes on a loaded 2-core machine)."""
    folder = tmp_path_factory.mktemp("warm")
    (folder / "cluster.yaml").write_text(yaml.safe_dump(cluster_doc()))
    (folder / "runs.yaml").write_text(yaml.safe_dump(run_doc()))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for argv in (plan_argv(folder / "cluster.yaml"), ["predict", folder / "runs.yaml", "--json"],
                     SEARCH + ["--gpus", 8, "--global-batch", 64, "--top", 100, "--json"]):
            main([str(a) for a in argv])


def one_line_error(code, out, err, *needles):
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, (code, out[:500], err[-2000:])
    assert lines[0].startswith("trainscale") and ": error: " in lines[0], lines[0]
    assert len(lines[0]) <= 330, len(lines[0])
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def write(tmp_path, doc=None, text=None, name="input.yaml"):
    path = tmp_path / name
    path.write_text(text if text is not None else yaml.safe_dump(doc), encoding="utf-8")
    return path


def run_doc(system=None, model=None, **plan):
    doc = json.loads(json.dumps(RUN))
    if system:
        doc["system"] = {"name": "dgx-h100", **system}
    if model:
        doc["model"] = {**SHAPE, **model}
    doc["plan"].update(plan)
    return doc


def cluster_doc(link=None, groups=None, links=None):
    doc = {"groups": groups if groups is not None else GROUPS, "links": links if links is not None else
           [{**LINK, **(link or {})}]}
    return doc


def plan_argv(path, batch=16):
    return ["plan", path, "--model", "llama2-7b", "--global-batch", batch, "--json"]


# --------------------------------------------------------------------------- cluster files
@pytest.mark.parametrize("field,value", [("bandwidth_GBps", ".nan"), ("latency_s", ".nan"),
                                         ("bandwidth_GBps", ".inf"), ("latency_s", ".inf"),
                                         ("bandwidth_GBps", "-.inf"), ("latency_s", "1.0e308")])
def test_non_finite_link_is_an_error_naming_the_field(tmp_path, capsys, field, value):
    text = yaml.safe_dump(cluster_doc()).replace(f"{field}: {LINK[field]!r}".replace("1e-05", "1.0e-05"),
                                                 f"{field}: {value}")
    assert f"{field}: {value}" in text
    one_line_error(*cli(plan_argv(write(tmp_path, text=text)), capsys), field)


@pytest.mark.parametrize("batch", ["20000000000000000000", str(2**40)])
def test_huge_global_batch_for_plan_is_bounded(tmp_path, capsys, batch):
    one_line_error(*cli(plan_argv(write(tmp_path, cluster_doc()), batch), capsys), "global-batch")


@pytest.mark.parametrize("key", ["groups", "links"])
def test_groups_or_links_not_a_list(tmp_path, capsys, key):
    doc = cluster_doc()
    doc[key] = 5
    one_line_error(*cli(plan_argv(write(tmp_path, doc)), capsys), key)


def test_unknown_link_key_is_rejected_like_run_and_group_keys(tmp_path, capsys):
    link = dict(LINK)
    link["latency"] = link.pop("latency_s")
    one_line_error(*cli(plan_argv(write(tmp_path, cluster_doc(links=[link]))), capsys), "latency", "unknown link")


def test_conflicting_links_for_one_pair_are_rejected(tmp_path, capsys):
    links = [LINK, {"between": ["b", "a"], "bandwidth_GBps": 1.0, "latency_s": 0.0}]
    one_line_error(*cli(plan_argv(write(tmp_path, cluster_doc(links=links))), capsys), "linked twice")


def test_self_link_is_rejected(tmp_path, capsys):
    links = [LINK, {"between": ["a", "a"], "bandwidth_GBps": 1.0, "latency_s": 0.0}]
    one_line_error(*cli(plan_argv(write(tmp_path, cluster_doc(links=links))), capsys), "between")


@pytest.mark.parametrize("override,field", [({"peak_flops_bf16": 1e-300}, "peak_flops_bf16"),
                                            ({"scale_out_latency_s": 1e308}, "scale_out_latency_s")])
def test_edge_values_in_a_cluster_group_are_errors_naming_the_field(tmp_path, capsys, override, field):
    groups = [dict(GROUPS[0], system={"name": "dgx-a100-80gb", **override}), GROUPS[1]]
    one_line_error(*cli(plan_argv(write(tmp_path, cluster_doc(groups=groups))), capsys), field)


def test_duplicate_key_in_a_cluster_file(tmp_path, capsys):
    text = yaml.safe_dump(cluster_doc()).replace("nodes: 2", "nodes: 2\n  nodes: 3", 1)
    one_line_error(*cli(plan_argv(write(tmp_path, text=text)), capsys), "duplicate key 'nodes'", "line")


# --------------------------------------------------------------------------- run files
@pytest.mark.parametrize("doc,field", [
    (run_doc(system={"peak_flops_bf16": 1e-300}), "peak_flops_bf16"),
    (run_doc(system={"scale_up_latency_s": 1e308}), "scale_up_latency_s"),
    (run_doc(system={"scale_out_latency_s": 1e308}), "scale_out_latency_s"),
    (run_doc(system={"peak_flops_bf16": 312}), "peak_flops_bf16"),  # TFLOP/s for FLOP/s: out of range
    (run_doc(model={"hidden": 2**64}), "hidden"),
    (run_doc(model={"seq_len": 2**31}), "seq_len"),
    ({**RUN, "gpus": 2**70}, "gpus"),
    (run_doc(global_batch=2**70), "global_batch"),
    (run_doc(model={"experts": 2**64}), "experts"),
])
def test_run_values_out_of_range_are_errors_naming_the_field(tmp_path, capsys, doc, field):
    one_line_error(*cli(["predict", write(tmp_path, doc), "--json"], capsys), field)


def test_peak_under_one_tflops_says_tflops(tmp_path, capsys):
    line = one_line_error(*cli(["predict", write(tmp_path, run_doc(system={"peak_flops_bf16": 312})), "--json"],
                               capsys))
    assert "TFLOP/s" in line


def test_plausibility_warning_for_a_unit_slip_inside_the_range(tmp_path, capsys):
    code, out, err = cli(["predict", write(tmp_path, run_doc(system={"hbm_bandwidth_GBps": 3.35})), "--json"],
                         capsys)
    assert code == 0 and json.loads(out)[0]["step_time_s"] > 0
    assert err.strip().splitlines() == [err.strip()] and err.startswith("trainscale: warning: ")
    assert "hbm_bandwidth_GBps" in err and "TB/s" in err


def test_duplicate_run_ids(tmp_path, capsys):
    one_line_error(*cli(["predict", write(tmp_path, {"runs": [RUN, RUN]}), "--json"], capsys), "'r'", "unique")


def test_duplicate_yaml_keys_in_a_run_file(tmp_path, capsys):
    text = yaml.safe_dump(RUN) + "gpus: 8\n"
    one_line_error(*cli(["predict", write(tmp_path, text=text), "--json"], capsys), "duplicate key 'gpus'")


def test_duplicate_yaml_keys_in_a_model_file_for_search(tmp_path, capsys):
    text = yaml.safe_dump(SHAPE) + "hidden: 8192\n"
    argv = ["search", "--model", write(tmp_path, text=text), "--system", "dgx-h100", "--gpus", 8,
            "--global-batch", 16]
    one_line_error(*cli(argv, capsys), "duplicate key 'hidden'")


@pytest.mark.parametrize("text", ["a: " + "[" * 5000 + "]" * 5000 + "\n",
                                  "a: " + "{b: " * 3000 + "1" + "}" * 3000 + "\n"])
def test_deeply_nested_yaml(tmp_path, capsys, text):
    one_line_error(*cli(["predict", write(tmp_path, text=text), "--json"], capsys), "nesting deeper")


def test_alias_bomb_and_long_values_give_capped_lines(tmp_path, capsys):
    bomb = ["b0: &b0 [" + ", ".join(["x"] * 10) + "]"]
    bomb += [f"b{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * 10) + "]" for i in range(1, 9)]
    one_line_error(*cli(["predict", write(tmp_path, text="\n".join(bomb) + "\n"), "--json"], capsys), "aliases")
    line = one_line_error(*cli(["predict", write(tmp_path, {**RUN, "system": "x" * 100_000}), "--json"], capsys))
    assert "..." in line and len(line) <= len("trainscale: error: ") + inputs.MAX_MESSAGE


# --------------------------------------------------------------------------- search
SEARCH = ["search", "--model", "llama2-7b", "--system", "dgx-h100"]


@pytest.mark.parametrize("extra,needle", [
    (["--gpus", 2**70, "--global-batch", 64], "--gpus"),
    (["--gpus", 64, "--global-batch", 2**70], "--global-batch"),
    (["--gpus", 64, "--global-batch", 64, "--fix", f"tp={2**70}"], "tp"),
    (["--gpus", 64, "--global-batch", 64, "--seq-len", 2**31], "seq_len"),
    (["--gpus", 64, "--global-batch", 64, "--top", 10**9], "--top"),
])
def test_search_bounds(capsys, extra, needle):
    one_line_error(*cli(SEARCH + extra, capsys), needle)


def test_search_says_no_split_exists_instead_of_no_plan_fits(capsys):
    code, out, err = cli(SEARCH + ["--gpus", 17, "--global-batch", 64], capsys)
    assert code == 0 and "no valid plan" in out and "17 GPUs" in out and "fits in memory" not in out
    code, out, err = cli(SEARCH + ["--gpus", 17, "--global-batch", 64, "--json"], capsys)
    assert code == 0 and json.loads(out)["best"] == [] and "no valid plan" in json.loads(out)["reason"]


def test_search_lists_each_plan_once(capsys):
    """Plans that are the same plan (shard_group 0 vs dp, sequence parallelism at tp 1, TP overlap without
    it) are listed once. Different plans may tie (context parallelism 2 at twice the micro-batch prices
    like cp 1 when its ring hides behind attention), so rows are compared as plans, not as numbers."""
    code, out, _ = cli(SEARCH + ["--gpus", 8, "--global-batch", 64, "--top", 100, "--json"], capsys)
    assert code == 0
    best = json.loads(out)["best"]
    assert len(best) == 100
    assert len({perfmodel.canonical_plan(e["plan"]) for e in best}) == len(best)


def test_canonical_plan_equivalences():
    base = {"tp": 1, "dp": 8, "zero": 1, "shard_group": 0, "sequence_parallel": False, "tp_comm_overlap": False,
            "zero3_per_tensor": False}
    same = [dict(base, shard_group=8), dict(base, sequence_parallel=True),
            dict(base, sequence_parallel=True, tp_comm_overlap=True), dict(base, zero3_per_tensor=True)]
    assert {perfmodel.canonical_plan(p) for p in same} == {perfmodel.canonical_plan(base)}
    assert perfmodel.canonical_plan(dict(base, tp=2, sequence_parallel=True)) != \
        perfmodel.canonical_plan(dict(base, tp=2))


# --------------------------------------------------------------------------- the shared layer
def test_strict_yaml_loader():
    assert inputs.load_yaml_text("a: 1\nb: [1, 2]\n") == {"a": 1, "b": [1, 2]}
    assert inputs.load_yaml_text("base: &b {x: 1}\nc: {<<: *b, y: 2}\n")["c"] == {"x": 1, "y": 2}  # merge keys
    for text, needle in [("a: 1\na: 2\n", "duplicate key 'a'"), ("x: {a: 1, a: 1}\n", "duplicate key"),
                         ("[" * 100 + "]" * 100, "nesting"), ("a: [\n", "malformed YAML"),
                         ("\x00", "malformed YAML")]:
        with pytest.raises(SpecError, match=needle) as err:
            inputs.load_yaml_text(text, "f.yaml")
        assert str(err.value).startswith("f.yaml: ") and "\n" not in str(err.value)


def test_every_shipped_yaml_file_loads_strictly():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = sorted((root / "pkg" / "trainscale" / "data").rglob("*.yaml")) + sorted((root / "examples").glob("*.yaml"))
    files += [root / "config" / "config.yaml", root / "config" / "schema.yaml"]
    assert files
    for path in files:
        inputs.load_yaml(path)


def _same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


def test_catalog_loader_reads_the_shipped_files_as_the_strict_loader_does():
    """The catalogs are parsed by libyaml (issue 38 item 5: ~0.5 s of every command in the pure-Python parser): the
    same documents, value for value and type for type, and duplicate keys still refused with their line."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = sorted((root / "pkg" / "trainscale" / "data").rglob("*.yaml")) + sorted((root / "examples").glob("*.yaml"))
    for path in files:
        assert _same(inputs.load_yaml(path, inputs.CatalogLoader), inputs.load_yaml(path)), path
    assert inputs.load_yaml_text("base: &b {x: 1}\nc: {<<: *b, y: 2}\n", loader_class=inputs.CatalogLoader) == \
        {"base": {"x": 1}, "c": {"x": 1, "y": 2}}
    for text, needle in [("a: 1\na: 2\n", "duplicate key 'a'"), ("a: [\n", "malformed YAML")]:
        with pytest.raises(SpecError, match=needle) as err:
            inputs.load_yaml_text(text, "f.yaml", inputs.CatalogLoader)
        assert str(err.value).startswith("f.yaml: ") and "\n" not in str(err.value)
    assert "line 2" in str(pytest.raises(SpecError, inputs.load_yaml_text, "a: 1\na: 2\n", "f.yaml",
                                         inputs.CatalogLoader).value)


def test_one_line_caps_and_short_repr_bounds():
    assert inputs.one_line("a\n  b\tc") == "a b c"
    capped = inputs.one_line("x" * 10_000)
    assert len(capped) == inputs.MAX_MESSAGE and capped.endswith("...")
    assert len(inputs.short_repr(list(range(10**6)))) < 80
    nested = []
    for _ in range(10_000):
        nested = [nested]
    assert len(inputs.short_repr(nested)) < 80


def test_check_finite_names_the_field():
    inputs.check_finite({"a": 1.0, "b": [1, 2.5], "c": "text", "d": None})
    with pytest.raises(SpecError, match=r"step_time_s = nan .*overflowed"):
        inputs.check_finite({"id": "r", "step_time_s": float("nan")}, where="run 'r'")
    with pytest.raises(SpecError, match=r"stages\[1\]\.time_s = inf"):
        inputs.check_finite({"stages": [{"time_s": 1.0}, {"time_s": float("inf")}]})


def test_keyboard_interrupt_is_one_line(monkeypatch, capsys):
    from trainscale.interface.cli import data as cli_data  # the module of the `models` command

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_data, "cmd_models", interrupted)
    code = main(["models"])
    assert code == 130 and capsys.readouterr().err == "trainscale: interrupted\n"


# --------------------------------------------------------------------------- notebook parameters
def test_check_parameters_converts_and_names_the_parameter():
    defaults = {"include_vtrain_single": False, "gpus": 64, "bandwidth": 12.5, "name": "x", "sizes": [1]}
    ns = {"include_vtrain_single": "true", "gpus": "128", "bandwidth": 3, "name": "y", "sizes": [2, 3]}
    assert inputs.check_parameters(ns, defaults) == {"include_vtrain_single": True, "gpus": 128, "bandwidth": 3.0,
                                                     "name": "y", "sizes": [2, 3]}
    assert ns["include_vtrain_single"] is True and ns["gpus"] == 128
    for name, value, needle in [("include_vtrain_single", "badvalue", "true or false"),
                                ("gpus", "64x", "integer"), ("gpus", True, "integer"), ("gpus", 2**70, "64 bits"),
                                ("bandwidth", "nan", "finite"), ("bandwidth", 10**400, "finite"),
                                ("name", 3, "string"), ("sizes", 3, "list")]:
        with pytest.raises(inputs.ParameterError) as err:
            inputs.check_parameters({name: value}, {name: defaults[name]})
        message = str(err.value)
        assert message.startswith(f"{name} = ") and needle in message and "\n" not in message
    with pytest.raises(inputs.ParameterError, match="gpus = 0 is invalid; expected a value >= 1"):
        inputs.check_parameters({"gpus": 0}, {"gpus": 64}, bounds={"gpus": {"minimum": 1}})
    with pytest.raises(inputs.ParameterError, match="expected one of a, b"):
        inputs.check_parameters({"name": "c"}, {"name": "a"}, bounds={"name": {"choices": ("a", "b")}})


def test_papermill_parameter_of_the_wrong_type_fails_naming_it(tmp_path):
    """The helper in a notebook's first code cell: `-p include_vtrain_single badvalue` fails with one line
    naming the parameter instead of being taken as true."""
    papermill = pytest.importorskip("papermill")
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("include_vtrain_single = False\ngpus = 64")
    params.metadata["tags"] = ["parameters"]
    check = nbformat.v4.new_code_cell(
        "from trainscale.common.inputs import check_parameters\n"
        "check_parameters(globals(), {'include_vtrain_single': False, 'gpus': 64})")
    nb.cells = [params, check, nbformat.v4.new_code_cell("print(include_vtrain_single, gpus)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    source = tmp_path / "p.ipynb"
    nbformat.write(nb, source)
    papermill.execute_notebook(str(source), str(tmp_path / "ok.ipynb"), kernel_name="python3",
                               parameters={"include_vtrain_single": "yes", "gpus": "8"}, progress_bar=False,
                               execution_timeout=600)  # a lost kernel message fails, not hangs
    out = nbformat.read(tmp_path / "ok.ipynb", as_version=4)
    assert out.cells[-1].outputs[0]["text"] == "True 8\n"
    with pytest.raises(papermill.PapermillExecutionError) as err:
        papermill.execute_notebook(str(source), str(tmp_path / "bad.ipynb"), kernel_name="python3",
                                   parameters={"include_vtrain_single": "badvalue"}, progress_bar=False,
                                   execution_timeout=600)  # a lost kernel message fails, not hangs
    assert err.value.ename == "ParameterError"
    assert err.value.evalue == "include_vtrain_single = 'badvalue' is invalid; expected true or false"


# --------------------------------------------------------------------------- progress bars
def test_progress_bars_only_on_a_terminal(monkeypatch):
    from trainscale.common import progress

    items = [1, 2, 3]
    monkeypatch.delenv("TRAINSCALE_PROGRESS", raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert progress.progress(items) is items
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    bar = progress.progress(items, 3, "x")
    assert bar is not items and list(bar) == items
    monkeypatch.setenv("TRAINSCALE_PROGRESS", "0")
    assert progress.progress(items) is items


def test_plan_shows_a_bar_on_a_terminal_and_none_otherwise(monkeypatch, capsys):
    """The exact planner's loop over replica counts (the long part of ``trainscale plan``) carries a bar."""
    from trainscale.model import hetero

    cluster = hetero.Cluster.from_dict({"groups": [{"name": "a", "system": "dgx-a100-80gb", "nodes": 4}]})
    problem = hetero.problem("llama2-7b", cluster, 32, max_stages=4)
    monkeypatch.setenv("TRAINSCALE_PROGRESS", "0")
    quiet = hetero.plan(problem)
    assert "plan: replica counts" not in capsys.readouterr().err
    monkeypatch.setenv("TRAINSCALE_PROGRESS", "1")
    shown = hetero.plan(problem)
    assert "plan: replica counts" in capsys.readouterr().err
    assert (shown.dp, shown.groups, shown.layers) == (quiet.dp, quiet.groups, quiet.layers)
