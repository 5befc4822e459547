"""heterogeneous-cluster on the quick workflow's outputs: the planner's invariants, and the fraction of the sum
of the parts defined only where each part can train alone (the paper comparison is judged on the committed full
data by tests/test_verify.py)."""

import json

import numpy as np
import pytest

from trainscale.common import io as tsio
from trainscale.model.specs import SpecError
from trainscale.studies import heterogeneous_cluster as study



@pytest.fixture(scope="module")
def swept(quick_workflow):
    return tsio.read_dataset(quick_workflow / "figures" / "heterogeneous-cluster" / "mix.nc")


@pytest.fixture(scope="module")
def mix(swept):
    """The quick run at its reference bandwidth between the types."""
    return swept.sel(bandwidth_GBps=json.loads(swept.attrs["parameters"])["reference_bandwidth_GBps"])


@pytest.fixture(scope="module")
def direct():
    """A small direct call: llama2-7b on 8 nodes, two bandwidths between the types."""
    return study.heterogeneous_mix("llama2-7b", ["dgx-a100-80gb", "dgx-v100"], 8, [0, 0.5, 1.0], [3.125, 12.5], 128,
                                   max_stages=4, reference_bandwidth_GBps=12.5)


@pytest.mark.workflow
def test_the_planner_beats_an_even_split_and_never_exceeds_the_sum_of_the_parts(mix):
    share = mix["fraction"].values
    mixed = (share > 0) & (share < 1)
    tput = mix["tokens_per_s"]
    assert (tput.sel(approach="mixed").values[mixed] > tput.sel(approach="even-split").values[mixed]).all()
    frac = mix["fraction_of_sum"].values
    defined = mix["alone_fits"].values.all(axis=1)
    assert np.array_equal(np.isfinite(frac), defined)
    assert (frac[defined] <= 1 + 1e-9).all(), frac
    assert frac[~mixed] == pytest.approx(1.0, rel=1e-9)  # homogeneous ends: the cluster is its own sum


@pytest.mark.workflow
def test_the_faster_type_carries_more_layers_than_its_share_of_nodes(mix):
    share, layers = mix["fraction"].values, mix["layers_on_first"].values
    mixed = (share > 0) & (share < 1)
    assert (np.diff(layers) > 0).all(), layers
    assert (layers[mixed] > share[mixed]).all(), layers


def test_compare_takes_the_best_defined_mix_at_the_reference_bandwidth_and_the_range_over_all(direct, tmp_path):
    ds = direct.copy(deep=True)
    ok = study._mixed(ds)
    assert ok.tolist() == [False, True, False]
    frac = ds["fraction_of_sum"].values
    assert np.isfinite(frac[:, ok]).all() and (frac[:, ok] <= 1 + 1e-9).all()
    frac[0, 1] = 0.5  # a worse mix at the other bandwidth lowers the range, not the headline
    tsio.write_dataset(ds, tmp_path / "mix.nc")
    best, direction = study.compare(tmp_path)
    assert best.our_low == pytest.approx(0.5)
    assert best.our_value == pytest.approx(float(ds["fraction_of_sum"].sel(bandwidth_GBps=12.5).values[1]))
    assert not best.same_setting and best.verdict in ("partly", "not reproduced")
    assert direction.neutral == 1.0 and direction.our_value > 1


def test_a_part_that_cannot_train_alone_leaves_the_ratio_undefined(tmp_path):
    # llama2-70b: one V100 server cannot hold it, so at 7 A100 + 1 V100 the sum of the parts is no reference
    ds = study.heterogeneous_mix("llama2-70b", ["dgx-a100-80gb", "dgx-v100"], 8, [0.875], [12.5], 64, max_stages=4)
    assert ds["alone_fits"].values.tolist() == [[True, False]]
    assert np.isnan(ds["fraction_of_sum"].values).all()
    assert np.isfinite(ds["tokens_per_s"].sel(approach="mixed").values).all()


def test_the_reference_bandwidth_must_be_swept():
    with pytest.raises(SpecError, match="reference_bandwidth_GBps"):
        study.heterogeneous_mix("llama2-7b", ["dgx-a100-80gb", "dgx-v100"], 8, [0.5], [3.125], 128,
                                reference_bandwidth_GBps=12.5)
