"""Index constants of the plain float arrays that carry specs into the kernels.

Kernels take a model vector, a system vector, a calibration vector and integer plan fields;
these names say which slot holds what. ``trainscale.model.perfmodel`` fills them from the specs.
"""

# model vector
M_LAYERS = 0
M_HIDDEN = 1
M_HEADS = 2
M_KV_HEADS = 3
M_FFN = 4
M_FFN_MATS = 5  # 2 (gelu) or 3 (swiglu)
M_VOCAB = 6
M_SEQ = 7
M_PARAMS_LAYER = 8
M_PARAMS_EMBED = 9  # input embedding (+ learned positions)
M_PARAMS_HEAD = 10  # output projection (+ final norm)
M_TENSORS_LAYER = 11  # weight matrices per layer: 4 fused (Megatron's GPT), else Q, K, V, O + FFN (DeepSpeed's ZeRO-3 fetches each one)
# mixture of experts (all zero for a dense model: the kernels then take the dense path)
M_EXPERTS = 12  # experts per MoE layer (0 or 1: dense)
M_TOP_K = 13  # experts each token is routed to
M_CAPACITY = 14  # capacity factor: tokens an expert processes, relative to a perfectly balanced share
M_PARAMS_EXPERTS = 15  # parameters of all experts of one layer (M_PARAMS_LAYER then holds the rest)
M_ROTARY = 16  # 1 where every layer applies rotary position embeddings to its queries and keys
# attention and shared experts (0: the defaults, which the kernels then take exactly as before)
M_HEAD_DIM = 17  # width of one attention head where it is not hidden / heads (Qwen3, GPT-OSS); 0: hidden / heads
M_SHARED_FFN = 18  # total FFN width of a MoE layer's shared experts (shared_experts x their width), run on every token; 0: none
# multi-head latent attention (DeepSeek-V3; trainscale.model.model_spec.ModelSpec): M_KV_LORA 0 for other attention
M_Q_LORA = 19  # width of the query latent (0: queries projected directly from the hidden state)
M_KV_LORA = 20  # width of the key-value latent
M_QK_HEAD = 21  # channels per head of the keys and queries besides the rotary ones
M_QK_POS = 22  # rotary channels per head (the key's shared by all heads)
M_V_HEAD = 23  # channels per head of the values (and of the attention output)
# dropout probabilities (trainscale.model.model_spec.ModelSpec): a dropout keeps a 1-byte mask only where its p > 0
M_HIDDEN_DROPOUT = 24  # after the attention and the MLP blocks (Megatron-Core's hidden_dropout)
M_ATTENTION_DROPOUT = 25  # on the attention probabilities (attention_dropout)
M_EXPERT_BIAS = 26  # 1 where the experts' linear layers carry biases (GPT-OSS; kernels.moe.expert_bias_time)
M_GLU_CLAMP = 27  # the clamp of a clamped GLU (activation_func_clamp_value; 0: none; kernels.moe.glu_clamp_time)
M_MTP_LAYERS = 28  # multi-token prediction depths (Megatron-Core's mtp_num_layers): on the last stage, each one more layer,
#   a 2h -> h projection and another output layer and loss (kernels.layer.mtp_head_costs)
M_SIZE = 29

# system vector (SI units: FLOP/s, bytes/s, bytes, seconds, watts)
S_PEAK_FLOPS = 0
S_HBM_BW = 1
S_HBM_BYTES = 2
S_SMS = 3
S_TDP_W = 4
S_IDLE_W = 5
S_GPUS_PER_NODE = 6
S_SCALE_UP_DOMAIN = 7
S_SCALE_UP_BW = 8
S_SCALE_UP_LAT = 9
S_SCALE_OUT_BW = 10
S_SCALE_OUT_LAT = 11
# scale-out topology (all zero: one flat tier, the per-step latency already includes the hops)
S_LEAF_GPUS = 12  # GPUs under one tier-1 (leaf) switch of a two-tier fat-tree; 0 = one flat tier
S_OVERSUB = 13  # leaf oversubscription (downlink / uplink bandwidth); <= 1 = non-blocking
S_HOP_LAT = 14  # latency per link hop, added to the per-step latency (2 hops in a leaf, 4 via the spine)
S_NVLS_EFF = 15  # NVLink SHARP (NVSwitch multicast) all-reduce: NCCL's nvlsEfficiency for the generation; 0 = none
S_SIZE = 16

# calibration vector (per accelerator generation)
C_GEMM_PEAK_EFF = 0  # fitted: best achievable fraction of peak for a large GEMM
C_NET_EFF = 1  # fitted: achieved fraction of link bandwidth in collectives
C_FETCH_S = 2  # fitted: host-side cost of one ZeRO-3 parameter fetch (issue, wait, re-partition)
C_TILE_M = 3
C_TILE_N = 4
C_KERNEL_S = 5  # fixed cost per kernel (launch + tail)
C_HBM_EFF = 6  # achievable fraction of HBM bandwidth for streaming kernels
C_RESERVED_BYTES = 7  # memory held by the framework, CUDA context, NCCL buffers
C_POWER_COMPUTE = 8  # share of dynamic power drawn by the compute units at full use
C_POWER_MEMORY = 9  # share drawn by HBM traffic at full bandwidth
C_LAYER_HOST_S = 10  # fitted per stack: host time to issue one layer's forward (a pass takes at least this)
C_GRAD_BYTES = 11  # per stack: bytes of each gradient element held (4: fp32 main grads; 2: 16-bit)
C_ELEM_TRAFFIC = 12  # per stack: element-wise HBM traffic and kernels relative to fused kernels (1: fused)
C_SELECTIVE_SHARE = 13  # per stack: share of the forward (weight GEMMs, element-wise) its selective checkpointing recomputes
C_BF16_OPTIMIZER = 14  # per plan: 1 under DeepSpeed's BF16_Optimizer (fp32 gradients): it all-reduces them under ZeRO 1-2, not reduce-scatters, and adds each micro-batch's bf16 gradients into them
C_ATTN_EFF = 15  # per stack and generation: fused attention kernel's efficiency relative to the generation's GEMMs (1: native kernel)
C_OVERLAP_SLOWDOWN = 16  # common: slowdown of computation while a collective runs beside it (0: none)
C_ATTN_BWD_EFF = 17  # common: fused attention backward's efficiency relative to its forward's
C_SP_LAYOUT_COPY = 18  # per stack: 1 where sequence-parallel collectives gather / scatter a batch-first tensor along its sequence dim (one extra HBM copy of the full tensor each)
C_EVEN_SPLIT = 19  # per stack: 1 where an interleaved schedule needs every model chunk to hold the same number of layers (Megatron-LM)
C_LOSS_FWD_BYTES = 20  # per stack: HBM bytes its cross-entropy moves per logit element, forward (cast, max, exp, sum, normalise)
C_LOSS_BWD_BYTES = 21  # per stack: the same, backward (gradient scaling and the cast back to 16 bits)
C_LOSS_FWD_KERNELS = 22  # per stack: kernels its cross-entropy launches per micro-batch, forward
C_LOSS_BWD_KERNELS = 23  # per stack: the same, backward
C_ROTARY_BYTES = 24  # per stack: HBM bytes its rotary embedding moves per query / key element, each pass
C_ROTARY_KERNELS = 25  # per stack: kernels its rotary embedding launches per layer, each pass
C_TP_ASYNC_BWD = 26  # per plan: 1 where the backward's tensor-parallel collectives run asynchronously beside its GEMMs (Megatron-LM)
# precision of the linear layers (plan.precision, plan.fp8_recipe; bf16: 1, 0, 0, 0 and the kernels take the bf16 path)
C_LINEAR_SPEEDUP = 27  # per plan: the linear layers' GEMM rate relative to bf16 (low-precision peak / bf16 peak x relative efficiency)
C_CAST_BYTES = 28  # per plan: HBM bytes per element of each linear layer's input (and output gradient) to quantize it, each pass
C_WEIGHT_CAST_BYTES = 29  # per plan: HBM bytes per parameter to quantize the weights, once per step
C_LP_WEIGHT_BYTES = 30  # per plan: bytes per parameter of the low-precision weight copies held beside the 16-bit weights
C_STRAGGLER_SPREAD = 31  # fitted, common: relative spread of per-rank step times (kernels.scale.straggler_time_s)
C_PIPE_PARTITIONED = 32  # per stack: 1 where the pipeline engine sends 1/tp of each boundary tensor and all-gathers it over the tp ranks on receipt (DeepSpeed)
C_MOE_IMBALANCE = 33  # per plan: the busiest expert-parallel rank's routed tokens over the mean (plan.moe_imbalance; 1: balanced)
C_MOE_OP_HOST_S = 34  # common: host seconds to issue one Python-level PyTorch / Transformer Engine op of a MoE layer (moe_op_host_s in calibration.yaml)
C_EP_A2A_OVERLAP = 35  # per plan: 1 where the expert-parallel all-to-alls run beside another micro-batch's compute (plan.overlap_moe_expert_parallel_comm)
C_MOE_NODE_DEDUP = 36  # per plan: 1 where the dispatcher sends a token once per remote scale-up domain (plan.moe_dispatcher deepep, hybridep)
C_SAVED_INPUT_BYTES = 37  # per plan: bytes per element of a linear layer's saved input under a low-precision recipe (its quantized column-wise copy); 0 in bf16 (the 16-bit input itself)
C_RECOMPUTE_MODULES = 38  # per plan: bitmask (RM_*) of the modules Megatron-Core's selective recomputation re-runs (plan.recompute_modules); RM_CORE_ATTN by default
C_DP_BUCKET_FLOOR = 39  # per stack: fewest parameters in a data-parallel gradient bucket
C_DP_BUCKET_PER_RANK = 40  # per stack: parameters a bucket adds per data-parallel rank (Megatron-Core: 1e6)
C_DP_BUCKET_OVERLAP_ONLY = 41  # per stack: 1 where the stack buckets only with overlapped gradient reduction (else one bucket)
C_DP_BUCKET_PER_BLOCK = 42  # per stack: 1 where the stack reduces each wrapped block (a layer) as its own bucket (FSDP)
C_FULL_ITERATION_GRAPH = 43  # per plan: 1 where CUDA graphs capture the step's forward and backward (no host issue)
C_FUSED_GROUPED_MLP = 44  # per plan: 1 where the experts' MLP runs as two fused grouped-GEMM kernels (plan.fused_grouped_mlp)
C_ATTN_EXP_FLOPS = 45  # per generation: dense 16-bit tensor-core FLOPs per exponential of the special-function units (a fused attention's softmax; 0: not priced)
C_SIZE = 46

# recomputation modes
RC_NONE = 0
RC_SELECTIVE = 1
RC_FULL = 2

# modules of Megatron-Core's selective recomputation (plan.recompute_modules; kernels.activations), in the order of
# RECOMPUTE_MODULES in trainscale.model.spec_fields: bit i is module i
RM_CORE_ATTN = 1
RM_MLA_UP_PROJ = 2
RM_LAYERNORM = 4
RM_MOE_ACT = 8
RM_MLP = 16
RM_MOE = 32
RM_SHARED_EXPERTS = 64

# per-layer cost table (seconds per micro-batch on one GPU, and bytes)
L_FWD_GEMM = 0
L_FWD_ELEM = 1
L_FWD_TP = 2  # exposed tensor-parallel communication, forward
L_BWD_GEMM = 3
L_BWD_ELEM = 4
L_BWD_TP = 5
L_RECOMP = 6  # compute re-done in backward
L_RECOMP_TP = 7  # tensor-parallel communication re-done in backward
L_CP = 8  # exposed context-parallel communication, fwd + bwd
L_ACT_BYTES = 9  # activation bytes kept per micro-batch between forward and backward
L_WORK_BYTES = 10  # transient bytes while one layer runs its backward (activation gradients + recompute)
L_HEAD_FWD = 11  # output projection + loss, forward (last stage)
L_HEAD_BWD = 12
L_HEAD_BYTES = 13  # logits kept for backward
L_FLOPS_FWD = 14  # model FLOPs of one layer forward (whole layer, all TP ranks)
L_FLOPS_RECOMP = 15  # hardware FLOPs of the recomputed part (whole layer)
L_FLOPS_HEAD = 16  # model FLOPs of the output projection forward
L_HBM_TIME = 17  # time spent in memory-bound kernels, fwd + bwd + recompute (for power)
L_FWD_EP = 18  # expert-parallel all-to-all (dispatch + combine), forward
L_BWD_EP = 19  # the same in the backward pass, with the recomputed forward's
L_TP_TOTAL = 20  # tensor-parallel communication fwd + bwd + recompute, before any overlap
L_CP_TOTAL = 21  # context-parallel ring exchange fwd + bwd, before overlap with attention
L_CP_FWD = 22  # the forward pass's share of L_CP
L_FWD_MOE = 23  # MoE router scores and token permutation (memory-bound), forward
L_BWD_MOE = 24  # the same in the backward pass, with the recomputed forward's
L_FWD_MOE_HOST = 25  # MoE layer's host issue time the GPU waits for (after the tokens-per-expert sync), forward
L_BWD_MOE_HOST = 26  # the same in the backward pass, with the recomputed forward's
L_SIZE = 27

# plan-result vector
O_STEP = 0
O_COMPUTE = 1
O_RECOMPUTE = 2
O_TP_COMM = 3
O_CP_COMM = 4
O_PP_COMM = 5
O_BUBBLE = 6
O_DP_COMM = 7
O_OPTIMIZER = 8
O_MODEL_FLOPS = 9  # per GPU per step (average over GPUs)
O_HW_FLOPS = 10
O_MEM_BYTES = 11
O_REASON = 12
O_POWER_W = 13
O_ENERGY_J = 14  # per GPU per step
# what a pipeline simulation needs to re-time the step (per micro-batch unless named otherwise)
O_LAYER_FWD = 15  # one layer's forward, with its share of exposed CP / ZeRO-3 communication
O_LAYER_BWD = 16  # one layer's backward, with recomputation
O_HEAD_FWD = 17  # output layer + loss, forward
O_HEAD_BWD = 18
O_ENDS = 19  # ZeRO-3 gathers of the embedding / output layer, on each end stage
O_P2P = 20  # one activation transfer between neighbouring stages
O_DP_EXPOSED = 21  # per step: exposed data-parallel gradient synchronisation
O_GEMM_BUSY = 22  # per step on the critical stage: time in GEMMs (for power)
O_HBM_BUSY = 23  # per step on the critical stage: time in memory-bound kernels
O_EP_COMM = 24  # per step: expert-parallel all-to-all on the critical stage
# memory of the most loaded GPU by component (bytes); they add up to O_MEM_BYTES
O_MEM_WEIGHTS = 25  # 16-bit parameters held (a ZeRO-3 shard, or the stage's full share)
O_MEM_GRADS = 26  # gradients
O_MEM_OPTIMIZER = 27  # fp32 master weights and Adam moments
O_MEM_ACTIVATIONS = 28  # activations kept between forward and backward (all in-flight micro-batches)
O_MEM_TRANSIENT = 29  # activation gradients and recomputed activations of the layer in backward
O_MEM_BUFFERS = 30  # ZeRO-3 prefetched layers
O_MEM_RESERVED = 31  # CUDA context, library workspaces, communication buffers, fragmentation
# communication per step on the critical stage before overlap (the breakdown holds what is exposed)
O_TP_COMM_TOTAL = 32
O_CP_COMM_TOTAL = 33
O_DP_COMM_TOTAL = 34
O_STRAGGLER = 35  # per step: expected wait for the slowest of the synchronising ranks (kernels.scale)
O_MOE_PERMUTE = 36  # per step: MoE router scores and token permutation on the critical stage
O_MOE_HOST = 37  # per step: MoE layers' exposed host issue time on the critical stage (kernels.moe.moe_host_time)
O_SIZE = 38

MEMORY_COMPONENTS = ("weights", "gradients", "optimizer", "activations", "transient", "buffers", "reserved")
MEMORY_SLOTS = (25, 26, 27, 28, 29, 30, 31)

BREAKDOWN = ("compute", "recompute", "tp_comm", "cp_comm", "pp_comm", "pipeline_bubble", "dp_comm",
             "optimizer", "straggler")
# the slot of each breakdown entry; the mixture-of-experts terms come last: ``ep_comm`` (token dispatch and
# combine: the all-to-alls over the ep ranks, and the gathers over the etp ranks), ``moe_permute`` (router
# scores, permutation and un-permutation of the token copies), ``moe_host`` (the host's issue time of each MoE
# layer's dispatch, expert and combine ops that the GPU waits for after the dropless dispatcher's
# tokens-per-expert device-to-host sync: kernels.moe.moe_host_time)
BREAKDOWN_MOE = BREAKDOWN + ("ep_comm", "moe_permute", "moe_host")
MOE_BREAKDOWN = ("ep_comm", "moe_permute", "moe_host")
BREAKDOWN_SLOTS = (1, 2, 3, 4, 5, 6, 7, 8, 35, 24, 36, 37)

# reasons a plan is masked (0 = valid and fits)
REASONS = (
    "ok",
    "tp does not divide the attention heads",
    "tp does not divide the key/value heads",
    "pp*interleave pipeline chunks exceed the layers",
    "dp*micro_batch does not divide the global batch",
    "tp*pp*dp*cp does not equal the GPU count",
    "cp does not divide the sequence length",
    "interleaving needs pp > 1 and micro-batches divisible by pp",
    "shard_group does not divide dp",
    "does not fit in accelerator memory",
    "ep does not divide the experts and dp (or ep > 1 on a dense model)",
    "the stack splits layers evenly over interleaved chunks: pp*interleave must divide the layers",
    "the stack does not run this combination (data/stack_rules.yaml)",
)
R_OK = 0
R_TP_HEADS = 1
R_TP_KV = 2
R_PP_LAYERS = 3
R_BATCH = 4
R_GPUS = 5
R_CP_SEQ = 6
R_INTERLEAVE = 7
R_SHARD = 8
R_MEMORY = 9
R_EP = 10
R_UNEVEN_CHUNKS = 11
R_STACK_RULE = 12  # set by trainscale.model.searchspace after pricing (trainscale.model.stackrules), never by a kernel
