"""Multi-head latent attention (issue 36: "MLA where present"): DeepSeek-V3's attention priced with its own shapes
(trainscale.kernels.attention) instead of as 128-head multi-head attention."""

import re

import numpy as np
import pytest

from trainscale.kernels import layout as K
from trainscale.kernels.layer import layer_costs
from trainscale.model import perfmodel, validation
from trainscale.model.specs import ModelSpec, SpecError, SystemSpec

# DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json): 61 layers, the first 3 dense, 256 routed experts + 1 shared
DEEPSEEK_V3 = dict(layers=61, hidden=7168, heads=128, ffn_hidden=2048, ffn_type="swiglu", vocab=129280,
                   seq_len=4096, experts=256, top_k=8, shared_experts=1, dense_layers=3, dense_ffn_hidden=18432,
                   q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128)
MLA = dict(q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128)
H100 = SystemSpec.from_catalog("dgx-h100")


def test_deepseek_v3_has_the_parameters_its_paper_states():
    """DeepSeek-V3 technical report (arXiv 2412.19437, abstract): 671B parameters in total, 37B activated per token
    (the main model; multi-token prediction's module is not counted there). As 128-head MHA it had 2.5x the
    attention weights, 17B more parameters."""
    model = ModelSpec.from_dict(DEEPSEEK_V3, name="deepseek-v3")
    assert model.params() / 1e9 == pytest.approx(671, rel=0.002)
    assert model.active_params() / 1e9 == pytest.approx(37, rel=0.02)
    assert model.attention_params() == (7168 * 1536 + 1536 * 128 * 192 + 7168 * (512 + 64) + 512 * 128 * 256
                                        + 128 * 128 * 7168)


def test_the_published_deepseek_rows_carry_latent_attention():
    runs = [m.run for m in validation.public_runs() if m.run.model.name == "deepseek-v3"]
    assert len(runs) == 13 and all(r.model.is_mla and r.model.params() == pytest.approx(671.03e9, rel=1e-4)
                                   for r in runs)


def _dense_mla(**kw):
    """A small dense model with latent attention (DeepSeek-V3's proportions, h = 1024, 8 heads)."""
    shape = dict(layers=2, hidden=1024, heads=8, ffn_hidden=2816, ffn_type="swiglu", vocab=1000, seq_len=2048,
                 q_lora_rank=384, kv_lora_rank=128, qk_head_dim=64, qk_pos_emb_head_dim=32, v_head_dim=64)
    return ModelSpec.from_dict({**shape, **kw}, name="small-mla")


def _costs(model, tp=1, mb=1, sp=True, flash=True):
    lc = np.empty(K.L_SIZE)
    layer_costs(perfmodel.model_vector(model), perfmodel.system_vector(H100),
                perfmodel.calibration_vector(H100.generation), tp, 1, mb, K.RC_NONE, sp, flash, lc, 1, False, 0)
    return lc


@pytest.mark.parametrize("q_lora_rank", [384, 0])
@pytest.mark.parametrize("mb", [1, 3])
def test_the_kernels_flops_are_the_weights_the_spec_counts(q_lora_rank, mb):
    """Two codings of the same shapes: the kernel's forward FLOPs of a layer are 2 FLOPs per weight the spec counts
    (``attention_params`` and the FFN) per token, plus the attention core's two products at ``d_qk`` and
    ``d_v`` channels per head."""
    model = _dense_mla(q_lora_rank=q_lora_rank)
    tokens, s, a = mb * model.seq_len, model.seq_len, model.heads
    weights = model.attention_params() + 3 * model.hidden * model.ffn_hidden
    core = 2.0 * mb * s * s * a * (model.qk_head_dim + model.qk_pos_emb_head_dim + model.v_head_dim)
    assert _costs(model, mb=mb)[K.L_FLOPS_FWD] == pytest.approx(2.0 * tokens * weights + core, rel=1e-12)


def test_latent_attention_prices_fewer_weights_than_the_mha_it_was_priced_as():
    """DeepSeek-V3's layer, dense part alone: its latent attention's GEMMs against 128-head MHA of width 128 (how the
    rows were priced before): fewer projection FLOPs, more attention-core FLOPs (192 + 128 channels per head
    against 128 + 128)."""
    shape = {k: v for k, v in DEEPSEEK_V3.items() if k not in ("experts", "top_k", "shared_experts",
                                                                 "dense_layers", "dense_ffn_hidden", *MLA)}
    mha = ModelSpec.from_dict({**shape, "kv_channels": 128}, name="mha")
    mla = ModelSpec.from_dict({**shape, **MLA}, name="mla")
    assert mla.attention_params() / mha.attention_params() == pytest.approx(0.398, abs=0.001)
    lc_mha, lc_mla = _costs(mha, tp=8), _costs(mla, tp=8)
    assert lc_mla[K.L_FWD_GEMM] < lc_mha[K.L_FWD_GEMM]
    assert lc_mla[K.L_FLOPS_FWD] < lc_mha[K.L_FLOPS_FWD]


def test_duplicated_down_projections_run_on_the_sequence_shard():
    """The down projections are duplicated on every tensor-parallel rank: with sequence parallelism each rank
    projects its m / t tokens, without it all m, so turning sequence parallelism off costs GEMM time at tp > 1
    (and nothing at tp 1)."""
    shape = {k: v for k, v in DEEPSEEK_V3.items() if k not in ("experts", "top_k", "shared_experts",
                                                                 "dense_layers", "dense_ffn_hidden")}
    model = ModelSpec.from_dict(shape, name="deepseek-v3-dense")
    assert _costs(model, tp=4, sp=False)[K.L_FWD_GEMM] > _costs(model, tp=4, sp=True)[K.L_FWD_GEMM]
    assert _costs(model, tp=1, sp=False)[K.L_FWD_GEMM] == _costs(model, tp=1, sp=True)[K.L_FWD_GEMM]


@pytest.mark.parametrize("field, value, message", [
    ("q_lora_rank", 512, "q_lora_rank = 512 is invalid; only latent attention (kv_lora_rank > 0) has it"),
    ("v_head_dim", 0, "v_head_dim = 0 is invalid; latent attention (kv_lora_rank > 0) needs a positive width"),
    ("kv_channels", 128, "kv_lora_rank = 512 is invalid; latent attention sets its own head widths"),
])
def test_inconsistent_latent_attention_is_refused_naming_the_field(field, value, message):
    shape = dict(DEEPSEEK_V3)
    if field == "q_lora_rank":
        shape.update(kv_lora_rank=0, qk_head_dim=0, qk_pos_emb_head_dim=0, v_head_dim=0)
    shape[field] = value
    with pytest.raises(SpecError, match=re.escape(message)):
        ModelSpec.from_dict(shape, name="bad")


def test_the_inference_model_refuses_latent_attention_in_one_line():
    """Inference prices a KV cache of keys and values per head; latent attention caches its latent, which it does
    not price: refused, naming the field, rather than priced as something else."""
    from trainscale.model import inference
    for call in (lambda m: inference.kv_cache_bytes_per_gpu(m, 1, 1024),
                 lambda m: inference.block_time_s(m, "dgx-h100", 1, 1024)):
        with pytest.raises(SpecError, match=re.escape("kv_lora_rank = 128 is invalid; the inference model prices "
                                                      "multi-head and grouped-query attention only")):
            call(_dense_mla())
