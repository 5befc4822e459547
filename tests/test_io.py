"""trainscale.common.io: reproducible (byte-identical), atomic writes of datasets and figures."""

import json
import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import xarray as xr  # noqa: E402

from trainscale.common import io as tsio  # noqa: E402


def example_dataset(scale=1.0):
    gpus = np.array([8, 64, 512])
    systems = ["dgx-a100-80gb", "dgx-h100"]
    tokens = scale * np.arange(6.0).reshape(2, 3) + 1.0
    tokens[1, 2] = np.nan  # no plan fits
    return xr.Dataset(
        {
            "tokens_per_s": (("system", "gpus"), tokens, {"units": "1/s", "long_name": "tokens/s"}),
            "fits": (("system", "gpus"), np.isfinite(tokens), {"units": "1"}),
            "tp": (("system", "gpus"), np.array([[1, 2, 4], [1, 2, -1]]), {"units": "1"}),
            "plan": (("system", "gpus"), np.array([["a", "bb", "c"], ["d", "e", ""]]), {}),
        },
        coords={"system": systems, "gpus": ("gpus", gpus, {"units": "1", "long_name": "GPUs"})},
        attrs={
            **tsio.provenance({"gpus": gpus, "systems": systems}, seed=None),
            "mape": 0.05,
            "ids": ["x", "y"],
        },
    )


def temp_files(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_dataset_writes_are_byte_identical(tmp_path):
    first = tsio.write_dataset(example_dataset(), tmp_path / "a.nc")
    second = tsio.write_dataset(example_dataset(), tmp_path / "sub" / "b.nc")
    assert first.read_bytes() == second.read_bytes()
    # rewriting the same path gives the same bytes too
    tsio.write_dataset(example_dataset(), first)
    assert first.read_bytes() == second.read_bytes()
    assert tsio.write_dataset(example_dataset(scale=2.0), tmp_path / "c.nc").read_bytes() != first.read_bytes()
    assert temp_files(tmp_path) == []


def test_dataset_round_trip(tmp_path):
    ds = example_dataset()
    back = tsio.read_dataset(tsio.write_dataset(ds, tmp_path / "d.nc"))
    xr.testing.assert_identical(back, ds)
    assert back["fits"].dtype == bool
    assert back["tp"].dtype.kind == "i"
    assert back.attrs["seed"] == "none"


def test_read_dataset_leaves_file_closed(tmp_path):
    path = tsio.write_dataset(example_dataset(), tmp_path / "e.nc")
    tsio.read_dataset(path)
    tsio.write_dataset(example_dataset(scale=3.0), path)  # replacing an open HDF5 file would fail
    assert tsio.read_dataset(path)["tokens_per_s"][0, 1] == 4.0


def test_reading_once_reads_a_file_once_hands_out_copies_and_rereads_a_replaced_file(tmp_path, monkeypatch):
    path = tsio.write_dataset(example_dataset(), tmp_path / "f.nc")
    reads = []
    real_read = tsio._read_netcdf
    monkeypatch.setattr(tsio, "_read_netcdf", lambda p: reads.append(p) or real_read(p))
    with tsio.reading_once():
        first = tsio.read_dataset(path)
        first["tokens_per_s"][0, 0] = -1.0  # a caller changing its copy changes no other caller's
        first.attrs["mape"] = 9.0
        second = tsio.read_dataset(path)
        assert len(reads) == 1
        xr.testing.assert_identical(second, example_dataset())
        with tsio.reading_once():  # nested: the same cache
            tsio.read_dataset(path)
        assert len(reads) == 1
        tsio.write_dataset(example_dataset(scale=3.0), path)  # replaced: another file (inode, size or time)
        assert tsio.read_dataset(path)["tokens_per_s"][0, 1] == 4.0
        assert len(reads) == 2
    tsio.read_dataset(path)  # outside the block: read every time
    tsio.read_dataset(path)
    assert len(reads) == 4


def test_bool_and_none_attributes_are_stored(tmp_path):
    ds = example_dataset().assign_attrs(flag=True, nothing=None)
    back = tsio.read_dataset(tsio.write_dataset(ds, tmp_path / "f.nc"))
    assert back.attrs["flag"] == 1
    assert back.attrs["nothing"] == "none"
    assert ds.attrs["flag"] is True  # the caller's dataset is not modified


@pytest.mark.parametrize(
    "bad",
    [
        # rejected before any byte is written: a dict attribute
        lambda ds: ds.assign_attrs(parameters={"not": "serialisable"}),
        # fails while writing: an object array of dicts
        lambda ds: ds.assign(junk=("gpus", np.array([{}, {}, {}], dtype=object))),
    ],
    ids=["bad-attribute", "bad-variable"],
)
def test_failed_write_leaves_no_temp_file_and_keeps_old_file(tmp_path, bad):
    path = tsio.write_dataset(example_dataset(), tmp_path / "g.nc")
    before = path.read_bytes()
    with pytest.raises(Exception):
        tsio.write_dataset(bad(example_dataset(scale=5.0)), path)
    assert path.read_bytes() == before
    assert temp_files(tmp_path) == []
    with pytest.raises(Exception):
        tsio.write_dataset(bad(example_dataset()), tmp_path / "new" / "h.nc")
    assert not (tmp_path / "new" / "h.nc").exists()
    assert temp_files(tmp_path / "new") == []


def example_figure():
    fig, ax = plt.subplots(figsize=(3, 2))
    x = np.linspace(0, 1, 50)
    ax.plot(x, x**2, label="x²")
    ax.set(xlabel="x [1]", ylabel="y [1]", title="example")
    ax.legend()
    return fig


def test_png_writes_are_byte_identical_and_close_the_figure(tmp_path):
    fig = example_figure()
    first = tsio.save_figure(fig, tmp_path / "a.png")
    assert not plt.fignum_exists(fig.number)
    second = tsio.save_figure(example_figure(), tmp_path / "deeper" / "b.png", dpi=150)
    data = first.read_bytes()
    assert data.startswith(b"\x89PNG") and data == second.read_bytes()
    assert b"Software" not in data and b"atplotlib" not in data
    assert tsio.save_figure(example_figure(), tmp_path / "c.png", dpi=100).read_bytes() != data
    assert temp_files(tmp_path) == []


def test_failed_figure_save_leaves_no_temp_file(tmp_path):
    fig = example_figure()
    fig.axes[0].text(0.5, 0.5, r"$\notacommand{x}$")  # mathtext error at draw time
    with pytest.raises(ValueError):
        tsio.save_figure(fig, tmp_path / "bad.png")
    assert list(tmp_path.iterdir()) == []
    assert not plt.fignum_exists(fig.number)


def test_provenance_is_json_and_timeless():
    attrs = tsio.provenance({"b": np.int64(2), "a": [1, 2], "path": tsio.Path("x")}, seed=np.int64(7))
    assert set(attrs) == {"trainscale_version", "git_commit", "parameters", "seed"}
    assert attrs["parameters"] == '{"a": [1, 2], "b": 2, "path": "x"}'
    assert json.loads(attrs["parameters"]) == {"a": [1, 2], "b": 2, "path": "x"}
    assert attrs["seed"] == 7 and type(attrs["seed"]) is int
    assert attrs["trainscale_version"]
    assert attrs == tsio.provenance({"a": [1, 2], "path": "x", "b": 2}, seed=7)


def test_git_commit_without_git(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on PATH
    assert tsio.git_commit() == "unknown"
    assert tsio.provenance({})["git_commit"] == "unknown"


def test_git_commit_outside_a_repository(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert tsio.git_commit(tmp_path) == "unknown"


@pytest.mark.skipif(tsio.shutil.which("git") is None, reason="git not installed")
def test_git_commit_clean_and_dirty(tmp_path, monkeypatch):
    def git(*args):
        tsio.subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    for key, value in {
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
    }.items():
        monkeypatch.setenv(key, value)
    git("init", "-q")
    (tmp_path / "a.txt").write_text("a")
    assert tsio.git_commit(tmp_path) == "unknown-dirty"  # no commit yet, untracked file
    git("add", "a.txt")
    git("commit", "-q", "-m", "a")
    head = tsio.subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert tsio.git_commit(tmp_path) == head
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "f.png").write_bytes(b"x")  # workflow outputs do not count
    assert tsio.git_commit(tmp_path) == head
    # nor do the prose and the tests: committing them keeps the provenance
    (tmp_path / "README.md").write_text("words")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("x = 1")
    assert tsio.git_commit(tmp_path) == head
    git("add", "README.md", "tests")
    git("commit", "-q", "-m", "docs and tests")
    assert tsio.git_commit(tmp_path) == head
    (tmp_path / "a.txt").write_text("b")
    assert tsio.git_commit(tmp_path / "a.txt") == head + "-dirty"


def test_stale_temporary_files_of_a_killed_write_are_removed(tmp_path):
    """A write killed before its move (SIGKILL) leaves `.<name>.<host>.<pid>.<random>.tmp`; the next write of
    the same output removes it when its process is gone (or the file has the older name), never a live
    writer's file or another output's."""
    import os
    import socket
    import subprocess
    import sys

    host = socket.gethostname().replace(".", "_")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f".x.nc.{host}.{dead_pid}.abcd1234.tmp"
    legacy = tmp_path / ".x.nc.k2j3h4g5.tmp"  # the name before host and pid were in it
    live = tmp_path / f".x.nc.{host}.{os.getpid()}.live0000.tmp"
    other = tmp_path / f".y.nc.{host}.{dead_pid}.abcd1234.tmp"
    for path in (stale, legacy, live, other):
        path.write_bytes(b"")
    tsio.write_dataset(example_dataset(), tmp_path / "x.nc")
    assert not stale.exists() and not legacy.exists()
    assert live.exists() and other.exists()
    assert temp_files(tmp_path) == sorted([live.name, other.name])
