#!/usr/bin/env python3
"""Writes the bench/published-runs/*.yaml measured-runs files from the
published figures quoted below, with every derivation printed next to the
number it produces. Rerun: /usr/bin/python3 bench/published-runs/derive_published_runs.py

Every input number here was read in a public source (named per block); the
iteration times of the Megatron-LM rows are derived from the reported
achieved TFLOP/s per GPU with the paper's own FLOP count (its Eq. 3, which
counts the recomputation forward):
    F = 96 * B * s * l * h^2 * (1 + s/(6h) + V/(16 l h))
    iteration_s = F / (TFLOPs_per_GPU * 1e12 * n_GPUs)
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def megatron_flops(B, s, l, h, V):
    return 96.0 * B * s * l * h * h * (1 + s / (6.0 * h) + V / (16.0 * l * h))


def fmt_model_gpt(name, l, h, a, V):
    return (f"{{name: {name}, num_layers: {l}, hidden: {h}, num_heads: {a}, "
            f"ffn: {4 * h}, vocab: {V}, mlp: gelu, tied_embeddings: true}}")


# ---------------------------------------------------------------------------
# 1. Narayanan et al. SC21 (arXiv 2104.04473), Table 1, as transcribed in
#    SotaroKaneda/MLCarbon data/megatron_table.csv
#    (commit 69070b28de401b6800d30f435db32996473560e2), columns:
#    params(B), heads, hidden, layers, TP, PP, GPUs, batch, TFLOP/s per GPU,
#    % of peak, aggregate PFLOP/s. Corroborated by paper summaries read in
#    this session: "At 1T parameters on 3,072 GPUs: 163 TFLOP/s per GPU",
#    "At 175B on 1,536 GPUs: 148 TFLOP/s per GPU".
#    Setup (paper section 5, via the same summaries): Selene, DGX A100 nodes of
#    8 x 80GB A100, NVLink/NVSwitch, 8 x 200 Gbps HDR InfiniBand per node;
#    s = 2048, V = 51,200; mixed precision (fp16), activation recomputation;
#    the interleaved schedule with scatter/gather is used for Table 1.
# ---------------------------------------------------------------------------
TABLE1 = [
    # params, heads, hidden, layers, tp, pp, gpus, batch, tflops, pct, agg
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44, 4.4),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44, 8.8),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46, 18.2),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43, 34.6),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44, 70.8),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45, 143.8),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47, 227.1),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50, 297.4),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52, 410.2),
    (1008, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52, 502),
]
S, V = 2048, 51200
# Dev data (used to set/check preset constants and as calibration anchors);
# the rest is evaluation only. See README.md.
TABLE1_DEV = {1.7, 145.6}

MEGATRON_2021_FRAMEWORK = ("{preset: megatron-core, sequence_parallel: false, "
                           "attention: materialized, attention_dropout: true}")
# DLPerf's Megatron-LM @8aa4619f: its README does not say whether the
# pipeline sends were scattered over the TP ranks; the two dev runs decide
# (findings.md item 9): a compute-scale fit on them leaves an rms log error
# of 0.061 with scatter/gather, 0.005 without.
DLPERF_MEGATRON_FRAMEWORK = ("{preset: megatron-core, sequence_parallel: false, "
                             "attention: materialized, attention_dropout: true, "
                             "pipeline_scatter_gather: false}")


def write_megatron():
    out = []
    out.append('source: "Narayanan et al. 2021 (SC21, arXiv 2104.04473) Table 1 '
               '(via SotaroKaneda/MLCarbon data/megatron_table.csv @69070b28) and '
               'the NVIDIA/Megatron-LM README GPT-3 example (@d086a2e3 README.md; '
               'examples/pretrain_gpt3_175B.sh @090e141c). Selene DGX A100-80GB, '
               '8 GPUs/node, 8x200 Gb/s HDR InfiniBand per node. Iteration times '
               'derived from achieved TFLOP/s per GPU, see each run."')
    out.append("runs:")
    for (P, a, h, l, tp, pp, n, B, X, pct, agg) in TABLE1:
        dp = n // (tp * pp)
        assert dp * tp * pp == n
        F = megatron_flops(B, S, l, h, V)
        it = F / (X * 1e12 * n)
        # consistency with the aggregate column: agg PFLOP/s = X * n / 1000
        label = f"gpt-{P:g}b tp{tp} pp{pp} dp{dp}"
        out.append(f"  # Table 1 row: {P:g}B | {a} heads | h={h} | l={l} | t={tp} | p={pp} | "
                   f"{n} GPUs | B={B} | {X} TFLOP/s/GPU | {pct}% | {agg} PFLOP/s")
        out.append(f"  # F = 96*{B}*{S}*{l}*{h}^2*(1+{S}/(6*{h})+{V}/(16*{l}*{h})) = {F:.4e} FLOP")
        out.append(f"  # iteration_s = F / ({X}e12 * {n}) = {it:.3f} s"
                   f"   (check: {X}*{n}/1000 = {X*n/1000:.1f} PFLOP/s vs table {agg})")
        out.append(f"  # micro_batch: NOT STATED in Table 1; assumed 1 as in Megatron's own "
                   f"GPT-3 175B script (--micro-batch-size 1). {B // dp} sequences per replica "
                   f"-> {B // dp} micro-batches.")
        if pp > 1:
            out.append("  # Measured with the INTERLEAVED 1F1B schedule (chunks per stage not "
                       "stated); Arachne prices plain 1F1B, so its bubble is an upper bound here.")
        out.append(f"  # split: {'dev' if P in TABLE1_DEV else 'eval'}")
        out.append(f"  - label: \"{label}\"")
        out.append(f"    source: \"Narayanan et al. 2021, Table 1, {P:g}B row; iteration time derived\"")
        out.append(f"    model: {fmt_model_gpt(f'gpt-{P:g}b', l, h, a, V)}")
        out.append(f"    cluster: {{inter_node_gbps: 1600, node_groups: [{{gpu: A100-80GB, "
                   f"gpus_per_node: 8, count: {n // 8}}}]}}")
        out.append(f"    training: {{seq_len: {S}, global_batch: {B}, precision: fp16, "
                   f"recompute: full, framework: {MEGATRON_2021_FRAMEWORK}}}")
        out.append(f"    plan: {{tp: {tp}, pp: {pp}, dp: {dp}, micro_batch: 1}}")
        out.append(f"    measured: {{iteration_s: {it:.3f}}}")
    # README GPT-3 example: a directly measured iteration time.
    l, h, a, B, n = 96, 12288, 96, 1536, 1024
    F = megatron_flops(B, S, l, h, V)
    out.append("  # NVIDIA/Megatron-LM README.md (@d086a2e3), 'GPT-3 Example': \"With full global")
    out.append("  # batch size of 1536 on 1024 A100 GPUs, each iteration takes around 32 seconds")
    out.append("  # resulting in 138 teraFLOPs per GPU which is 44% of the theoretical peak FLOPs.\"")
    out.append("  # examples/pretrain_gpt3_175B.sh (@090e141c): --tensor-model-parallel-size 8")
    out.append("  # --pipeline-model-parallel-size 16 --num-layers 96 --hidden-size 12288")
    out.append("  # --num-attention-heads 96 --seq-length 2048 --micro-batch-size 1")
    out.append("  # --global-batch-size 1536 --fp16 --checkpoint-activations; 128 nodes x 8.")
    out.append(f"  # Cross-check of the FLOP formula: F/(138e12*1024) = {F / (138e12 * n):.2f} s (README: ~32 s).")
    out.append("  # Vocabulary: the script's GPT-2 BPE vocab padded to 51,200 as in the paper (assumed).")
    out.append("  # Cluster: A100 80GB assumed (the README says 'A100'; Table 1 ran on Selene A100-80GB).")
    out.append("  # split: dev")
    out.append("  - label: \"gpt3-175b tp8 pp16 dp8 (README example)\"")
    out.append("    source: \"NVIDIA/Megatron-LM README.md @d086a2e3 'GPT-3 Example' + examples/pretrain_gpt3_175B.sh @090e141c\"")
    out.append(f"    model: {fmt_model_gpt('gpt3-175b', l, h, a, V)}")
    out.append("    cluster: {inter_node_gbps: 1600, node_groups: [{gpu: A100-80GB, gpus_per_node: 8, count: 128}]}")
    out.append(f"    training: {{seq_len: 2048, global_batch: 1536, precision: fp16, recompute: full, "
               f"framework: {MEGATRON_2021_FRAMEWORK}}}")
    out.append("    plan: {tp: 8, pp: 16, dp: 8, micro_batch: 1}")
    out.append("    measured: {iteration_s: 32.0}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------
# 2. BLOOM-176B, bigscience-workshop/bigscience train/tr11-176B-ml/README.md
#    (commit 00327f8c3533c39b3cc17013f0d0d2b770eb2bb9).
# ---------------------------------------------------------------------------
def write_bloom():
    return """source: "BLOOM-176B training (bigscience-workshop/bigscience, train/tr11-176B-ml/README.md @00327f8c). Megatron-DeepSpeed + DeepSpeed BF16_Optimizer (its own ZeRO-1), 48 nodes x 8 A100-80GB, 4 x 100 Gb/s Omni-Path per node."
runs:
  # README quotes:
  #  "GPUs: 416 A100 80GB GPUs (52 nodes) - using 384 gpus (48 nodes)"; "8 GPUs per node
  #   Using NVLink 4 inter-gpu connects, 4 OmniPath links"
  #  "NHIDDEN=14336 NLAYERS=70 NHEADS=112"; "SEQ_LEN=2048"; "Vocabulary size is 250,680 tokens";
  #   "embedding size: v*h: 250880*14336" (padded vocabulary 250,880)
  #  "TP=4 PP=12 DP=8 MBS=2"; "GLOBAL_BATCH_SIZE=2048"; "--bf16"; "--deepspeed-activation-checkpointing"
  #  "The new BF16_Optimizer implements its own ZeRO Stage 1"; "accumulates grads in fp32. It doesn't
  #   shard the static fp32 buffer it reuses, which consumes 4 bytes * params of additional memory"
  #  "--position-embedding-type alibi", "--embed-layernorm", "torch.nn.functional.gelu",
  #   "--attention-dropout 0.1"
  #  Measured: "iteration 85376/ 115311 | ... | elapsed time per iteration (s): 104.70 | ...
  #   global batch size: 2048 | ... | TFLOPs: 149.77"
  # Link speed: "4 Omni-Path 100 Gbps links per node" (BLOOM paper arXiv 2211.05100 p.18, as quoted in a
  #   model card read in this session) -> inter_node_gbps 400.
  # Tied embeddings: the README's --pp-partition-method note speaks of "the tied embedding layers".
  # Pipeline partition: 'type:transformer|embedding' puts the embedding on stage 0 and the tied output
  #   layer on stage 11 (5 blocks there, 6 elsewhere); Arachne balances layers itself.
  # split: eval
  - label: "bloom-176b tp4 pp12 dp8"
    source: "bigscience tr11-176B-ml README @00327f8c, 'Important checkpoints' log line (iteration 85376)"
    model: {name: bloom-176b, num_layers: 70, hidden: 14336, num_heads: 112, ffn: 57344, vocab: 250880, mlp: gelu, tied_embeddings: true}
    cluster: {inter_node_gbps: 400, node_groups: [{gpu: A100-80GB, gpus_per_node: 8, count: 48}]}
    training: {seq_len: 2048, global_batch: 2048, precision: bf16, recompute: full, framework: {preset: megatron-deepspeed, grad_bytes_per_param: 4, optimizer_grad_bytes_per_param: 0}}
    plan: {tp: 4, pp: 12, dp: 8, micro_batch: 2}
    measured: {iteration_s: 104.70}
"""


# ---------------------------------------------------------------------------
# 3. torchtitan docs/performance.md (pytorch/torchtitan @eaea6f6a), Llama 3.1 8B, FSDP2.
# ---------------------------------------------------------------------------
def write_torchtitan():
    rows = [
        # gpus, local_bs, global_bs, tps_per_gpu, mem_gib, table
        (8, 2, 16, 5762, 82.4, "Table 1"),
        (128, 2, 256, 5605, 67.0, "Table 3"),
    ]
    seq = 8192
    out = ['source: "torchtitan docs/performance.md @eaea6f6a (Llama 3.1 8B, FSDP2, selective AC, '
           'Grand Teton H100 96GB HBM2e at 500 W; 400 Gb/s RDMA per GPU). GPU SUBSTITUTED: the catalog '
           'has no H100 96GB; runs use H100-80GB, see README."',
           "runs:"]
    for (n, lbs, gbs, tps, mem, tab) in rows:
        tokens_per_gpu = gbs * seq / n
        it = tokens_per_gpu / tps
        out.append(f"  # {tab}: \"1D Parallelism (FSDP). Llama 3.1 8B model. {n} GPUs. Local batch size {lbs}, "
                   f"global batch size {gbs}. Selective activation checkpointing.\" Row 'FSDP': "
                   f"TPS/GPU {tps:,}, Memory(GiB) {mem}.")
        out.append("  # Platform: \"Each host has 8 NVIDIA H100 GPUs fully connected with NVLink\"; \"96GB HBM2e with")
        out.append("  #  2.4 TB/sec\"; \"backend RDMA network with 400 Gb/s per GPU\" -> 8 x 400 = 3200 Gb/s per node;")
        out.append("  #  \"default 500W power limit\". Throughput read at the 90th iteration; memory = max over GPUs.")
        out.append("  # seq_len 8192 and selective_ac_option 'op': torchtitan/models/llama/train_configs/llama3_8b.toml "
                   "(@08a5a9f3) 'seq_len = 8192', \"mode = 'selective'\", \"selective_ac_option = 'op'\".")
        out.append("  # Model: torchtitan Llama 3.1 8B args dim 4096, n_layers 32, n_heads 32, n_kv_heads 8, "
                   "vocab 128256, multiple_of 1024, ffn_dim_multiplier 1.3 -> ffn 14336 = catalog llama3-8b.")
        out.append(f"  # iteration_s = global_batch*seq/n/TPS = {gbs}*{seq}/{n}/{tps} = {it:.3f} s")
        out.append("  # precision bf16 assumed (FSDP2 mixed precision in torchtitan; not read here); SDPA (flash) attention.")
        out.append(f"  # split: {'dev' if n == 8 else 'eval'}")
        out.append(f"  - label: \"llama3.1-8b fsdp{n} (torchtitan)\"")
        out.append(f"    source: \"torchtitan docs/performance.md @eaea6f6a, {tab}, row FSDP\"")
        out.append("    model: llama3-8b")
        out.append(f"    cluster: {{inter_node_gbps: 3200, node_groups: [{{gpu: H100-80GB, gpus_per_node: 8, "
                   f"count: {n // 8}}}]}}")
        out.append(f"    training: {{seq_len: {seq}, global_batch: {gbs}, precision: bf16, recompute: selective, "
                   f"framework: {{preset: fsdp}}}}")
        out.append(f"    plan: {{tp: 1, pp: 1, dp: {n}, micro_batch: {lbs}}}")
        out.append(f"    measured: {{iteration_s: {it:.3f}, peak_memory_gib: {mem}}}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------
# 4. MosaicML llm-foundry MPT benchmarks (FSDP FULL_SHARD via Composer),
#    scripts/train/benchmarking/README.md @061f2c7c; rows in llm_foundry_rows.md.
#    Model dims from scripts/train/yamls/pretrain/mpt-<size>.yaml (read this
#    session): d_model / n_heads / n_layers, expansion_ratio 4, vocab 50368.
# ---------------------------------------------------------------------------
MPT = {  # size: (n_layers, d_model, n_heads, yaml commit)
    "1b": (24, 2048, 16, "06560d59"),
    "3b": (32, 2560, 20, "34c28fc9"),
    "7b": (32, 4096, 32, "15fb4ffa"),
    "13b": (40, 5120, 40, "309f6837"),
    "30b": (48, 7168, 56, "39393a21"),
    "70b": (80, 8192, 64, "17e6d631"),
}
GPU_ID = {"h100_80gb": "H100-80GB", "a100_80gb": "A100-80GB", "a100_40gb": "A100-40GB"}
# Dev runs per GPU type (fit / check constants); everything else is evaluation.
MPT_DEV = {("h100_80gb", "7b", 4096, 8), ("h100_80gb", "13b", 2048, 8),
           ("a100_80gb", "7b", 4096, 8), ("a100_80gb", "13b", 2048, 8),
           ("a100_40gb", "13b", 2048, 8), ("a100_40gb", "13b", 2048, 64)}


def read_foundry_rows():
    rows = []
    for line in open(os.path.join(HERE, "llm_foundry_rows.md")):
        if not line.startswith("|"):
            continue
        f = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(f) == 20, line
        r = dict(size=f[0], seq=int(f[1]), gpus=int(f[2]), gpu=f[3], mfu=float(f[4]),
                 mb=int(f[7]), ga=int(f[8]), gbs=int(f[9]), tps=int(f[11]),
                 tps_gpu=int(f[12]), gbs_tokens=int(f[13]), precision=f[14],
                 mp_mode=f[15], ac=(f[17] == "True"), line=line.strip())
        # Internal consistency of the transcription.
        assert r["mb"] * r["ga"] * r["gpus"] == r["gbs"], line
        assert r["gbs"] * r["seq"] == r["gbs_tokens"], line
        assert abs(r["tps"] / r["gpus"] - r["tps_gpu"]) <= 1, line
        rows.append(r)
    return rows


def write_foundry():
    out = ['source: "MosaicML llm-foundry MPT training benchmarks (scripts/train/benchmarking/README.md '
           '@061f2c7c): Composer + PyTorch FSDP FULL_SHARD, bf16, flash/triton attention; A100 sections on '
           '\'1600 Gbps node-node interconnect (RoCE)\'. Iteration time = GlobalBatchSize(T) / Throughput(T/s)."',
           "runs:"]
    skipped = []
    for r in read_foundry_rows():
        if r["size"] not in MPT:
            continue
        if r["gpu"] == "h100_80gb" and r["gpus"] > 8:
            continue  # the H100 section states no inter-node network
        if r["mb"] & (r["mb"] - 1) or r["mb"] > 32:
            # The cost model prices power-of-two micro-batches only
            # (plan validation: "must be a power of two <= 128"), and the
            # synthesized profiles stop at 32 (CostParams max_micro_batch_size).
            skipped.append(f"{r['size']} s{r['seq']} {r['gpus']}x{r['gpu']} mb{r['mb']}")
            continue
        l, h, a, commit = MPT[r["size"]]
        it = r["gbs_tokens"] / r["tps"]
        key = (r["gpu"], r["size"], r["seq"], r["gpus"])
        split = "dev" if key in MPT_DEV else "eval"
        label = f"mpt-{r['size']} s{r['seq']} {r['gpus']}x{GPU_ID[r['gpu']]} fsdp mb{r['mb']}"
        out.append(f"  # row: {r['line']}")
        out.append(f"  # iteration_s = GlobalBatchSize(T) / Throughput(T/s) = {r['gbs_tokens']} / {r['tps']} = {it:.4f} s;"
                   f" micro_batch {r['mb']} x grad_accum {r['ga']} x {r['gpus']} GPUs = {r['gbs']}")
        out.append(f"  # model: mpt-{r['size']}.yaml @{commit}: n_layers {l}, d_model {h}, n_heads {a}, "
                   "expansion_ratio 4, vocab_size 50368; output tied to wte (NumParams ~ 12*l*h^2 + V*h + s*h).")
        out.append(f"  # split: {split}")
        out.append(f"  - label: \"{label}\"")
        out.append(f"    source: \"llm-foundry benchmarking README @061f2c7c, {r['gpu']} table, row {r['size']} / {r['seq']} / {r['gpus']} GPUs\"")
        out.append(f"    model: {{name: mpt-{r['size']}, num_layers: {l}, hidden: {h}, num_heads: {a}, ffn: {4 * h}, "
                   f"vocab: 50368, mlp: gelu, tied_embeddings: true}}")
        nodes = max(1, r["gpus"] // 8)
        out.append(f"    cluster: {{inter_node_gbps: 1600, node_groups: [{{gpu: {GPU_ID[r['gpu']]}, gpus_per_node: 8, count: {nodes}}}]}}")
        out.append(f"    training: {{seq_len: {r['seq']}, global_batch: {r['gbs']}, precision: bf16, "
                   f"recompute: {'full' if r['ac'] else 'none'}, framework: {{preset: fsdp}}}}")
        out.append(f"    plan: {{tp: 1, pp: 1, dp: {r['gpus']}, micro_batch: {r['mb']}}}")
        out.append(f"    measured: {{iteration_s: {it:.4f}}}")
    out.insert(1, "# Not recorded (micro-batch not a power of two, or above 32, which the cost model cannot price): "
               + ", ".join(skipped))
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------
# 5. Oneflow-Inc/DLPerf GPT benchmarks on 4 nodes x 8 V100-SXM2-16GB,
#    "InfiniBand 100 Gb/sec (4X EDR)": NVIDIA Megatron-LM @8aa4619f
#    (Megatron-LM/README.md @01e43de4, scripts/mutil_perf_pretrain_gpt_dp_mp_pp.sh
#    @10f79798: --checkpoint-activations --fp16, SEQ_LENGTH=2048, GPT-2 vocab files)
#    and OneFlow GPT (OneFlow/LanguageModeling/GPT/README.md) on the same
#    machines and cases. "lantency" is the time per iteration, "memory" the
#    per-GPU memory in MiB. The V100 nodes are NVLink hybrid cube-mesh (the
#    README's nvidia-smi topo shows NV1/NV2/SYS links), not NVSwitch.
# ---------------------------------------------------------------------------
# case: (nodes, gpus_per_node, dp, tp, pp, micro_batch, global_batch, hidden, heads, layers)
DLPERF_CASES = {
    "DP_1x1x1_2_1536x16": (1, 1, 1, 1, 1, 2, 2, 1536, 16, 16),
    "DP_8x1x1_16_1536x16": (1, 8, 8, 1, 1, 2, 16, 1536, 16, 16),
    "DP_16x1x1_32_1536x16": (2, 8, 16, 1, 1, 2, 32, 1536, 16, 16),
    "DP_32x1x1_64_1536x16": (4, 8, 32, 1, 1, 2, 64, 1536, 16, 16),
    "MP_1x1x1_8_768x12": (1, 1, 1, 1, 1, 8, 8, 768, 12, 12),
    "MP_1x8x1_16_1536x16": (1, 8, 1, 8, 1, 16, 16, 1536, 16, 16),
    # MP_1x16x1_16_3072x16 and MP_1x32x1_16_3072x32 put one TP group across
    # 2 / 4 nodes; Megatron's uniform layout in Arachne refuses that, so they
    # are not recorded.
    "2D_8x1x1_16_1536x16": (1, 8, 8, 1, 1, 2, 16, 1536, 16, 16),
    "2D_1x8x1_16_1536x16": (1, 8, 1, 8, 1, 16, 16, 1536, 16, 16),
    "2D_2x4x1_16_1536x16": (1, 8, 2, 4, 1, 8, 16, 1536, 16, 16),
    "2D_4x2x1_16_1536x16": (1, 8, 4, 2, 1, 4, 16, 1536, 16, 16),
    "2D_2x8x1_16_2304x24": (2, 8, 2, 8, 1, 8, 16, 2304, 24, 24),
    "2D_4x8x1_32_2304x24": (4, 8, 4, 8, 1, 8, 32, 2304, 24, 24),
    "DP_PP_8x1x4_512_1536x16": (4, 8, 8, 1, 4, 2, 512, 1536, 16, 16),
    "MP_PP_1x8x4_512_2304x24": (4, 8, 1, 8, 4, 16, 512, 2304, 24, 24),
    "2D_PP_2x4x4_512_2304x24": (4, 8, 2, 4, 4, 8, 512, 2304, 24, 24),
    "2D_PP_2x8x2_512_2304x24": (4, 8, 2, 8, 2, 8, 512, 2304, 24, 24),
}
# case: (latency ms, memory MiB), the "测试结果" tables.
DLPERF_MEGATRON = {
    "DP_1x1x1_2_1536x16": (464.12, 14362), "DP_8x1x1_16_1536x16": (480.96, 14938),
    "DP_16x1x1_32_1536x16": (664.46, 14508), "DP_32x1x1_64_1536x16": (683.51, 14508),
    "MP_1x1x1_8_768x12": (611.2, 9810), "MP_1x8x1_16_1536x16": (692.44, 12684),
    "2D_8x1x1_16_1536x16": (480.22, 14938), "2D_1x8x1_16_1536x16": (664.64, 12684),
    "2D_2x4x1_16_1536x16": (576.48, 9104), "2D_4x2x1_16_1536x16": (593.68, 9642),
    "2D_2x8x1_16_2304x24": (1313.52, 14928), "2D_4x8x1_32_2304x24": (1508.48, 15004),
    "DP_PP_8x1x4_512_1536x16": (4893.55, 7130), "MP_PP_1x8x4_512_2304x24": (22166.85, 14204),
    "2D_PP_2x4x4_512_2304x24": (15331.23, 10018), "2D_PP_2x8x2_512_2304x24": (16281.51, 10554),
}
DLPERF_ONEFLOW = {
    "DP_1x1x1_2_1536x16": (406.16, 11066), "DP_8x1x1_16_1536x16": (417.95, 12404),
    "DP_16x1x1_32_1536x16": (489.67, 12200), "DP_32x1x1_64_1536x16": (518.64, 12208),
    "MP_1x1x1_8_768x12": (525.21, 7416), "MP_1x8x1_16_1536x16": (642.13, 6264),
    "2D_8x1x1_16_1536x16": (417.90, 12396), "2D_1x8x1_16_1536x16": (644.4, 6264),
    "2D_2x4x1_16_1536x16": (539.69, 6366), "2D_4x2x1_16_1536x16": (543.88, 7368),
    "2D_2x8x1_16_2304x24": (1268.53, 6998), "2D_4x8x1_32_2304x24": (1480.34, 6996),
    "DP_PP_8x1x4_512_1536x16": (4006.31, 8712), "MP_PP_1x8x4_512_2304x24": (19196.65, 15670),
    "2D_PP_2x4x4_512_2304x24": (13117.18, 11958), "2D_PP_2x8x2_512_2304x24": (14375.35, 10708),
}
DLPERF_DEV = {"DP_8x1x1_16_1536x16", "2D_PP_2x4x4_512_2304x24"}  # Megatron only
# The GPU columns of the README's `nvidia-smi topo -m` ("测试环境"), verbatim:
# the DGX-1 hybrid cube-mesh. One NVLink 2 moves 25 GB/s per direction
# (V100: 6 links, 300 GB/s both directions in all; cli99/llm-analysis
# v100 config).
DLPERF_TOPO = [
    "X   NV1 NV1 NV2 NV2 SYS SYS SYS",
    "NV1 X   NV2 NV1 SYS NV2 SYS SYS",
    "NV1 NV2 X   NV2 SYS SYS NV1 SYS",
    "NV2 NV1 NV2 X   SYS SYS SYS NV1",
    "NV2 SYS SYS SYS X   NV1 NV1 NV2",
    "SYS NV2 SYS SYS NV1 X   NV2 NV1",
    "SYS SYS NV1 SYS NV1 NV2 X   NV2",
    "SYS SYS SYS NV1 NV2 NV1 NV2 X",
]
DLPERF_TOPOLOGY = ("{nvlink_gbps: 25, gpu_links: [" +
                   ", ".join(f'"{row}"' for row in DLPERF_TOPO) + "]}")


def write_dlperf():
    out = ['source: "Oneflow-Inc/DLPerf GPT benchmarks, 4 nodes x 8 V100-SXM2-16GB (NVLink hybrid cube-mesh), '
           'InfiniBand 100 Gb/s EDR: NVIDIA Megatron-LM @8aa4619f (Megatron-LM/README.md @01e43de4) and OneFlow GPT '
           '(OneFlow/LanguageModeling/GPT/README.md); fp16, --checkpoint-activations, seq 2048."',
           "runs:"]
    for fw, table, where in (("megatron", DLPERF_MEGATRON, "Megatron-LM/README.md @01e43de4 '测试结果'"),
                             ("oneflow", DLPERF_ONEFLOW, "OneFlow/LanguageModeling/GPT/README.md '测试结果'")):
        for case, (nodes, gpn, dp, tp, pp, mb, gbs, h, a, l) in DLPERF_CASES.items():
            ms, mib = table[case]
            assert dp * tp * pp == nodes * gpn and gbs % (mb * dp) == 0, case
            # Megatron pads the vocabulary to a multiple of 128 * TP
            # (make_vocab_size_divisible_by 128; the OneFlow log shows 50257 ->
            # 50688 at tp 4).
            q = 128 * tp
            vocab = (50257 + q - 1) // q * q
            split = "dev" if (fw == "megatron" and case in DLPERF_DEV) else "eval"
            out.append(f"  # {where}: | {case} | {ms} (ms) | {mib} (MiB) |; case table: nodes {nodes}, "
                       f"gpus/node {gpn}, dp {dp}, tp {tp}, pp {pp}, micro-batch {mb}, global batch {gbs}, "
                       f"hidden {h}, heads {a}, layers {l}")
            out.append(f"  # vocab 50257 padded to a multiple of 128*tp = {vocab}; peak_memory_gib = {mib}/1024; "
                       f"memory is the per-GPU figure the README reports (device memory in use, allocator "
                       f"reserve included)")
            if fw == "oneflow":
                out.append("  # framework: OneFlow, not one of the presets; priced with the 2021-Megatron "
                           "overrides as the nearest (evaluation only).")
            out.append(f"  # split: {split}")
            out.append(f"  - label: \"dlperf {fw} {case}\"")
            out.append(f"    source: \"Oneflow-Inc/DLPerf {where}, row {case}\"")
            out.append(f"    model: {{name: gpt-h{h}-l{l}, num_layers: {l}, hidden: {h}, num_heads: {a}, "
                       f"ffn: {4 * h}, vocab: {vocab}, mlp: gelu, tied_embeddings: true}}")
            topology = f", topology: {DLPERF_TOPOLOGY}" if gpn == 8 else ""
            out.append(f"    cluster: {{inter_node_gbps: 100, node_groups: [{{gpu: V100-16GB, "
                       f"gpus_per_node: {gpn}, count: {nodes}{topology}}}]}}")
            framework = DLPERF_MEGATRON_FRAMEWORK if fw == "megatron" else MEGATRON_2021_FRAMEWORK
            out.append(f"    training: {{seq_len: 2048, global_batch: {gbs}, precision: fp16, recompute: full, "
                       f"framework: {framework}}}")
            out.append(f"    plan: {{tp: {tp}, pp: {pp}, dp: {dp}, micro_batch: {mb}}}")
            out.append(f"    measured: {{iteration_s: {ms / 1000:.5f}, peak_memory_gib: {mib / 1024:.3f}}}")
    return "\n".join(out) + "\n"


def main():
    files = {
        "megatron-lm-2021.yaml": write_megatron(),
        "bloom-176b.yaml": write_bloom(),
        "torchtitan-llama3-8b.yaml": write_torchtitan(),
        "llm-foundry-mpt.yaml": write_foundry(),
        "dlperf-v100.yaml": write_dlperf(),
    }
    for name, text in files.items():
        with open(os.path.join(HERE, name), "w") as f:
            f.write("# Generated by bench/published-runs/derive_published_runs.py; edit that, not this.\n")
            f.write(text)
        print("wrote", name)


if __name__ == "__main__":
    main()
