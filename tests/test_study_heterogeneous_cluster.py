"""heterogeneous-cluster on the quick workflow's outputs: the planner's invariants, and the fraction of the sum
of the parts defined only where each part can train alone (the paper comparison is judged on the committed full
data by tests/test_verify.py)."""

import numpy as np
import pytest

from trainscale import io as tsio
from trainscale.studies import heterogeneous_cluster as study

pytestmark = pytest.mark.workflow


@pytest.fixture(scope="module")
def mix(quick_workflow):
    return tsio.read_dataset(quick_workflow / "figures" / "heterogeneous-cluster" / "mix.nc")


def test_the_planner_beats_an_even_split_and_never_exceeds_the_sum_of_the_parts(mix):
    share = mix["fraction"].values
    mixed = (share > 0) & (share < 1)
    tput = mix["tokens_per_s"]
    assert (tput.sel(approach="mixed").values[mixed] > tput.sel(approach="even-split").values[mixed]).all()
    frac = mix["fraction_of_sum"].values
    nonempty_fit = mix["alone_fits"].values | (tput.sel(approach=["first-alone", "second-alone"]).values == 0)
    defined = nonempty_fit.all(axis=1)
    assert np.array_equal(np.isfinite(frac), defined)
    assert (frac[defined] <= 1 + 1e-9).all(), frac
    assert frac[~mixed] == pytest.approx(1.0, rel=1e-9)  # homogeneous ends: the cluster is its own sum


def test_the_faster_type_carries_more_layers_than_its_share_of_nodes(mix):
    share, layers = mix["fraction"].values, mix["layers_on_first"].values
    mixed = (share > 0) & (share < 1)
    assert (np.diff(layers) > 0).all(), layers
    assert (layers[mixed] > share[mixed]).all(), layers


def test_compare_takes_the_best_defined_mix_and_its_range(mix, tmp_path):
    ds = mix.copy()
    frac = ds["fraction_of_sum"].values.copy()
    ok = study._mixed(ds)
    assert ok.any()
    frac[np.flatnonzero(ok)[0]] = 0.5  # a worse mix lowers the range, not the best
    ds["fraction_of_sum"] = ("fraction", frac, ds["fraction_of_sum"].attrs)
    tsio.write_dataset(ds, tmp_path / "mix.nc")
    best, direction = study.compare(tmp_path)
    assert best.our_low == pytest.approx(0.5)
    assert best.our_value == pytest.approx(np.nanmax(frac[ok]))
    assert not best.same_setting and best.verdict in ("partly", "not reproduced")
    assert direction.neutral == 1.0 and direction.our_value > 1
