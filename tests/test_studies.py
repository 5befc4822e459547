"""Each study's comparison with its paper, checked on the quick workflow's outputs, and
byte-identical reruns."""

import hashlib
import json

import numpy as np
import pytest
import yaml

from conftest import QUICK_CONFIG, REPO_ROOT, run_snakemake, tail
from trainscale.model import catalog
from trainscale.common import io as tsio
from trainscale.studies import registry

pytestmark = pytest.mark.workflow




def test_validation_meets_the_published_accuracy_targets(quick_workflow):
    ds = tsio.read_dataset(quick_workflow / "figures" / "validation" / "validation.nc")
    pub = np.flatnonzero(ds["dataset"].values == "published")
    assert pub.size == len(catalog.published_runs())
    ape = np.abs(ds["rel_error"].values[pub])
    assert ape.mean() <= 0.10, f"published MAPE {ape.mean():.1%} > 10%"
    assert ape.max() <= 0.25, f"worst published run {ape.max():.1%} > 25%"  # as tests/test_validation.py
    assert ds.attrs["mape_published"] == pytest.approx(ape.mean(), rel=1e-12)


def _measured(results):
    """Outputs the studies declare as wall-clock timings of this machine (registry ``MEASURED``)."""
    config = yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text())
    return {results / "figures" / info.name / name for info in registry.load_all(config["studies"])
            for name in info.measured}


def _hashes(results):
    measured = _measured(results)
    files = sorted(p for p in (results / "figures").rglob("*") if p.suffix in (".nc", ".png") and p not in measured)
    assert files
    return {str(p.relative_to(results)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.mark.slow
def test_rerun_is_byte_identical(quick_workflow):
    """A forced rerun at the same commit writes the same bytes. The session run is the reference
    when its datasets record the current commit (a fresh clone, as in CI); outputs left from an
    earlier commit record that commit's id, so then a first forced run makes the reference."""
    def forced_run():
        proc = run_snakemake("--cores", "2", *QUICK_CONFIG, "--forceall")
        assert proc.returncode == 0, tail(proc.stdout)
        return _hashes(quick_workflow)

    commit = tsio.git_commit()
    recorded = {tsio.read_dataset(p).attrs.get("git_commit")
                for p in (quick_workflow / "figures").rglob("*.nc")}
    before = _hashes(quick_workflow) if recorded == {commit} else forced_run()
    after = forced_run()
    changed = sorted(name for name in before if before[name] != after.get(name))
    assert before.keys() == after.keys() and not changed, f"rerun changed {changed}"
