"""The C++ kernels against the torch ops they replace: decode and chunked prompt attention (also against dense attention), RMSNorm
(alone and after the residual add), SiLU·up, rotary with the K/V cache write, greedy picks straight from the
output head; and the row invariance the attention and norm kernels claim (a row's bits whatever shares its step)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from engine_proc.attention import AttentionMetadata, PagedAttention, PrefillSpan
from engine_proc.cpu import kernels as cpu_kernels
from engine_proc.cpu.argmax import greedy_ids
from engine_proc.cpu.features import CpuFeatures, cpu_features
from engine_proc.cpu.form_registry import KERNEL_FORMS
from engine_proc.cpu.greedy_head import GreedyHead
from engine_proc.cpu.kernels import has_amx, load_cpu_kernels
from engine_proc.loader import load_model
from engine_proc.models.attention_api import HeadNorms
from engine_proc.models.config import ModelConfig
from engine_proc.models.llama import RotaryEmbedding, apply_rotary
from proto import envs
from tests.engine_proc.attention_cases import decode_step, mixed_step
from tests.engine_proc.models.tiny_llama import TINY, run, save_tiny_checkpoint

# The default model's attention: 9 query heads over 3 KV heads of 64, blocks of 16.
SMOLLM2 = dict(dtype=torch.bfloat16, num_heads=9, num_kv_heads=3, head_dim=64, block_size=16, max_context_len=150)

needs_kernel = pytest.mark.skipif(
    load_cpu_kernels() is None,
    reason=f"no zeroserve CPU kernels here: they need x86 with AVX2 or AVX-512 BF16 and g++ ({cpu_features().describe()})",
)
needs_amx = pytest.mark.skipif(
    load_cpu_kernels() is None or not has_amx(), reason=f"this CPU has no AMX BF16 ({cpu_features().describe()})"
)


@needs_kernel
@pytest.mark.parametrize("query_lens", [[1], [1, 1, 1, 1, 1], [8], [1, 8, 3, 5], [2, 2]])
def test_kernel_attends_like_dense_attention_and_like_the_sdpa_path(query_lens: list[int]) -> None:
    out, expected = decode_step(query_lens, **SMOLLM2)
    sdpa_out, _ = decode_step(query_lens, **SMOLLM2, is_kernel_allowed=False)
    assert out.dtype == torch.bfloat16 and out.shape == expected.shape
    # NOTE: bfloat16 inputs, float32 sums in both; outputs differ by bfloat16 rounding only.
    torch.testing.assert_close(out.float(), expected, rtol=0.02, atol=0.02)
    torch.testing.assert_close(out, sdpa_out, rtol=0.02, atol=0.02)
    assert (out.float() - sdpa_out.float()).abs().mean() < 1e-3


@needs_kernel
@pytest.mark.parametrize(
    ("decode_contexts", "spans"),
    [
        ([], [(0, 230)]),  # a whole prompt
        ([], [(0, 5), (0, 16), (0, 17)]),  # short prompts, a chunk exactly, one token past
        ([40, 7, 300], [(32, 45), (0, 100)]),  # decodes first, a prompt after cached blocks, a new one
        ([12], [(47, 1), (512, 64)]),  # one new token after a cached prefix, a long chunked prompt
    ],
)
def test_prompts_are_attended_by_the_kernel_in_chunks_like_dense_attention(
    decode_contexts: list[int], spans: list[tuple[int, int]]
) -> None:
    out, expected = mixed_step(decode_contexts, spans)
    # NOTE: bfloat16 output (2**-8 relative), sums in float32
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)
    sdpa, _ = mixed_step(decode_contexts, spans, is_kernel_allowed=False)
    assert (out.float() - expected).abs().max() <= (sdpa.float() - expected).abs().max() + 2**-8


@needs_kernel
@pytest.mark.parametrize(("window", "has_sinks"), [(1, False), (20, False), (64, True), (None, True)])
@pytest.mark.parametrize("query_lens", [[1], [1, 8, 3, 5]])
def test_kernel_takes_windows_and_sinks_like_dense_attention_and_the_sdpa_path(
    query_lens: list[int], window: int | None, has_sinks: bool
) -> None:
    out, expected = decode_step(query_lens, **SMOLLM2, window=window, has_sinks=has_sinks)
    sdpa_out, _ = decode_step(query_lens, **SMOLLM2, is_kernel_allowed=False, window=window, has_sinks=has_sinks)
    torch.testing.assert_close(out.float(), expected, rtol=0.02, atol=0.02)
    assert (out.float() - sdpa_out.float()).abs().mean() < 1e-3


@needs_kernel
def test_a_context_of_many_blocks_with_a_partly_filled_last_block() -> None:
    out, expected = decode_step([1, 4], **{**SMOLLM2, "max_context_len": 900})
    torch.testing.assert_close(out.float(), expected, rtol=0.02, atol=0.02)


@needs_kernel
@pytest.mark.parametrize("head_dim", [16, 48, 80])
def test_head_sizes_other_than_sixty_four(head_dim: int) -> None:
    out, expected = decode_step([1, 3, 1], **{**SMOLLM2, "head_dim": head_dim})
    torch.testing.assert_close(out.float(), expected, rtol=0.02, atol=0.02)


def test_float32_keeps_the_exact_path() -> None:
    from engine_proc.attention import PagedAttention

    attention = PagedAttention(1, 64 * 16, 3, 64, 16, torch.float32, torch.device("cpu"))
    assert attention._decode_kernel is None


def test_the_kernel_can_be_switched_off_and_is_not_tried_on_other_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    build = load_cpu_kernels.__wrapped__
    monkeypatch.setenv("ZEROSERVE_CPU_KERNELS", "0")
    envs.read.cache_clear()
    assert build() is None
    monkeypatch.delenv("ZEROSERVE_CPU_KERNELS")
    envs.read.cache_clear()
    older_cpu = CpuFeatures(machine="x86_64", capability="DEFAULT", has_avx512_bf16=False, has_avx512_vnni=False, has_amx=False)
    monkeypatch.setattr(cpu_kernels, "cpu_features", lambda: older_cpu)
    assert build() is None


@needs_kernel
@pytest.mark.parametrize("num_rows", [1, 7, 130])
def test_fused_norm_and_swiglu_give_torchs_bfloat16_results(num_rows: int) -> None:
    kernels = load_cpu_kernels()
    torch.manual_seed(num_rows)
    x, weight = torch.randn(num_rows, 576).bfloat16(), torch.randn(576).bfloat16()
    x_float = x.float()
    normed = (x_float * torch.rsqrt(x_float.pow(2).mean(-1, keepdim=True) + 1e-5)).bfloat16()
    fused, expected = kernels.rms_norm(x, weight, 1e-5), weight * normed
    # NOTE: the same roundings, but the sum of squares in another order: now and then a value
    # lands one bfloat16 step away (2 in 75,000 here).
    assert (fused != expected).float().mean() < 1e-3
    torch.testing.assert_close(fused, expected, rtol=2**-7, atol=0)
    gate_up = torch.randn(num_rows, 2 * 1536).bfloat16() * 4
    gate, up = gate_up.chunk(2, dim=-1)
    assert torch.equal(kernels.silu_and_mul(gate_up), torch.nn.functional.silu(gate) * up)


@needs_kernel
@pytest.mark.parametrize("num_rows", [1, 7, 130])
def test_the_fused_residual_add_and_norm_give_torchs_bfloat16_results(num_rows: int) -> None:
    kernels = load_cpu_kernels()
    torch.manual_seed(num_rows)
    x, residual, weight = torch.randn(num_rows, 576).bfloat16(), torch.randn(num_rows, 576).bfloat16(), torch.randn(576).bfloat16()
    added = residual + x
    normed = kernels.add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(residual, added)  # updated in place, rounded as torch's bfloat16 add rounds
    assert (normed != kernels.rms_norm(added, weight, 1e-5)).sum() == 0


@needs_kernel
@pytest.mark.parametrize(("num_tokens", "head_dim"), [(1, 64), (5, 64), (40, 32), (3, 128)])
def test_rotary_and_the_cache_write_give_the_torch_ops_values(num_tokens: int, head_dim: int) -> None:
    torch.manual_seed(num_tokens)
    num_heads, num_kv_heads, block_size = 9, 3, 16
    config = ModelConfig(
        architecture="llama", vocab_size=100, hidden_size=num_heads * head_dim, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=head_dim, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512, tie_word_embeddings=True,
    )
    rotary = RotaryEmbedding(config).to(torch.bfloat16)
    positions = torch.randint(0, 512, (num_tokens,))
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim).bfloat16() * 3
    slots = torch.randperm(4 * block_size)[:num_tokens]
    attention = PagedAttention(1, 4 * block_size, num_kv_heads, head_dim, block_size, torch.bfloat16, torch.device("cpu"))
    attention.metadata = AttentionMetadata(slot_mapping=slots, num_decodes=0, decode_block_table=None, decode_lens=None, prefills=[])
    stored = attention.rotate_and_store(0, qkv, rotary(positions).table)
    assert stored is not None
    query, key = stored
    rows = rotary(positions)
    query_key = apply_rotary(qkv[:, : (num_heads + num_kv_heads) * head_dim].view(num_tokens, -1, head_dim), rows.cos, rows.sin)
    assert torch.equal(query, query_key[:, :num_heads]) and torch.equal(key, query_key[:, num_heads:])
    cache = attention.kv_caches[0]
    assert torch.equal(cache[0][:, slots].transpose(0, 1), key)
    assert torch.equal(cache[1][:, slots].transpose(0, 1), qkv[:, (num_heads + num_kv_heads) * head_dim :].view(num_tokens, -1, head_dim))
    untouched = torch.ones(4 * block_size, dtype=torch.bool)
    untouched[slots] = False
    assert not cache[:, :, untouched].any()


@needs_kernel
@pytest.mark.parametrize(("num_tokens", "head_dim"), [(1, 128), (6, 64)])
def test_per_head_norms_before_the_rotary_give_the_norm_kernels_then_the_rotarys_values(num_tokens: int, head_dim: int) -> None:
    """Qwen3's queries and keys normed per head in the same pass: the bits of `rms_norm` on each head, then the rotary."""
    torch.manual_seed(head_dim)
    kernels = load_cpu_kernels()
    num_heads, num_kv_heads, block_size = 8, 2, 16
    config = ModelConfig(
        architecture="llama", vocab_size=100, hidden_size=num_heads * head_dim, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=head_dim, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=512, tie_word_embeddings=True,
    )
    rows = RotaryEmbedding(config).to(torch.bfloat16)(torch.randint(0, 512, (num_tokens,)))
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim).bfloat16() * 3
    q_weight, k_weight = (torch.rand(head_dim) * 2).bfloat16(), (torch.rand(head_dim) * 2).bfloat16()
    slots = torch.randperm(4 * block_size)[:num_tokens]
    attention = PagedAttention(1, 4 * block_size, num_kv_heads, head_dim, block_size, torch.bfloat16, torch.device("cpu"))
    attention.metadata = AttentionMetadata(slot_mapping=slots, num_decodes=0, decode_block_table=None, decode_lens=None, prefills=[])
    stored = attention.rotate_and_store(0, qkv, rows.table, HeadNorms(q_weight, k_weight, 1e-6))
    assert stored is not None
    heads = qkv[:, : (num_heads + num_kv_heads) * head_dim].reshape(-1, head_dim).view(num_tokens, -1, head_dim)
    normed = torch.cat((
        kernels.rms_norm(heads[:, :num_heads].reshape(-1, head_dim), q_weight, 1e-6).view(num_tokens, num_heads, head_dim),
        kernels.rms_norm(heads[:, num_heads:].reshape(-1, head_dim), k_weight, 1e-6).view(num_tokens, num_kv_heads, head_dim),
    ), dim=1)
    query_key = apply_rotary(normed, rows.cos, rows.sin)
    assert torch.equal(stored[0], query_key[:, :num_heads]) and torch.equal(stored[1], query_key[:, num_heads:])
    cache = attention.kv_caches[0]
    assert torch.equal(cache[0][:, slots].transpose(0, 1), stored[1])
    assert torch.equal(cache[1][:, slots].transpose(0, 1), qkv[:, (num_heads + num_kv_heads) * head_dim :].view(num_tokens, -1, head_dim))


@needs_kernel
def test_a_bfloat16_model_gives_the_logits_it_gives_without_the_fused_layers(tmp_path: Path) -> None:
    save_tiny_checkpoint(tmp_path, "qwen3-qk-norm")  # per-head q/k norms: 3-D, left to torch
    model = load_model(tmp_path, dtype=torch.bfloat16)
    assert model.model.norm.kernels is not None and model.model.layers[0].mlp.kernels is not None
    seqs = [torch.randint(0, TINY["vocab_size"], (n,)) for n in (9, 1, 30)]
    with torch.no_grad():
        fused = run(model, seqs)
        for module in model.modules():
            if hasattr(module, "kernels"):
                module.kernels = None
        torch.testing.assert_close(fused, run(model, seqs), atol=0.02, rtol=0)


@needs_amx
@pytest.mark.parametrize(("num_rows", "hidden", "vocab_size"), [(1, 64, 1000), (17, 96, 5003), (40, 64, 49152)])
def test_greedy_head_picks_what_greedy_ids_picks_from_the_bfloat16_logits(
    num_rows: int, hidden: int, vocab_size: int
) -> None:
    kernels = load_cpu_kernels()
    torch.manual_seed(num_rows)
    x, weight = torch.randn(num_rows, hidden).bfloat16(), (torch.randn(vocab_size, hidden) * 0.1).bfloat16()
    picks = kernels.greedy_head(x, kernels.pack_greedy_head(weight), vocab_size)
    assert picks.dtype == torch.int64
    assert torch.equal(picks, greedy_ids(torch.nn.functional.linear(x, weight)))


@needs_amx
def test_greedy_head_breaks_ties_of_the_rounded_logits_as_argmax_does() -> None:
    kernels = load_cpu_kernels()
    x = torch.ones(3, 64, dtype=torch.bfloat16)
    weight = (torch.randn(100, 64) * 0.01).bfloat16()
    weight[5] = 1.0
    # NOTE: logit 64.0078 in float32 against 64.0 at id 5: both 64.0 in bfloat16, so id 5 comes first.
    weight[9] = 1.0
    weight[9, 0] = 1.0078125
    # NOTE: the vocabulary ends inside the last block of 32 ids: 97 is in it, 99 (the largest) past it.
    weight[97], weight[99] = 1.5, 2.0
    x[2, :32] = 0
    picks = kernels.greedy_head(x, kernels.pack_greedy_head(weight), 99)
    logits = torch.nn.functional.linear(x, weight[:99])
    assert picks.tolist() == greedy_ids(logits).tolist() == [97, 97, 97]
    picks = kernels.greedy_head(x, kernels.pack_greedy_head(weight[:97]), 97)
    assert picks.tolist() == [5, 5, 5]
    # NOTE: every logit negative: the least negative wins, the first of equals.
    negative = -(weight.abs() + 0.25)
    negative[40] = negative[70] = -0.25
    picks = kernels.greedy_head(x, kernels.pack_greedy_head(negative), 100)
    assert picks.tolist() == greedy_ids(torch.nn.functional.linear(x, negative)).tolist() == [40, 40, 40]


@needs_amx
def test_a_model_takes_greedy_picks_from_the_head_from_sixteen_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_tiny_checkpoint(tmp_path, "llama")
    monkeypatch.setattr(GreedyHead, "is_faster_at", lambda self, num_rows, raw_logits: True)
    model = load_model(tmp_path, dtype=torch.bfloat16, batch_invariant=False)
    assert model.greedy_head is not None
    hidden = torch.randn(300, TINY["hidden_size"]).bfloat16()
    assert model.compute_greedy_ids(hidden[:15]) is None
    for num_rows in (16, 300):
        assert torch.equal(model.compute_greedy_ids(hidden[:num_rows]), greedy_ids(model.compute_raw_logits(hidden[:num_rows])))


@needs_amx
def test_a_process_refused_amx_keeps_the_plain_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_tiny_checkpoint(tmp_path, "llama")

    def refused(self: GreedyHead, num_rows: int, raw_logits: object) -> bool:
        raise RuntimeError("the kernel asked Linux for AMX tile state and was refused")

    monkeypatch.setattr(GreedyHead, "is_faster_at", refused)
    model = load_model(tmp_path, dtype=torch.bfloat16, batch_invariant=False)
    assert model.greedy_head is None
    assert model.compute_greedy_ids(torch.randn(32, TINY["hidden_size"]).bfloat16()) is None


def target_rows(
    cached: int, others: list[tuple[int, int]], is_decode: bool, seed: int, window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One sequence of 45 tokens (the same K/V and queries every time) attended from position `cached`
    on, its earlier K/V in the cache, in a bfloat16 step with other sequences ((cached, new) each,
    one new token: a decode), each in blocks scattered as `seed` draws them, over a `window` and with `sinks`
    where given: its rows [45 - cached, H, D]."""
    num_heads, num_kv_heads, head_dim, block_size, length = 9, 3, 64, 16, 45
    sequences = [(cached, length - cached), *others]
    decodes = [i for i, (_, new) in enumerate(sequences) if new == 1 and (is_decode or i != 0)]
    order = decodes + [i for i in range(len(sequences)) if i not in decodes]
    rng = torch.Generator().manual_seed(seed)
    data = []
    for i, (start, new) in enumerate(sequences):
        generator = torch.Generator().manual_seed(0 if i == 0 else seed * 100 + i)  # the target's never changes
        total = start + new
        data.append([torch.randn(total, heads, head_dim, generator=generator).bfloat16() for heads in (num_heads, num_kv_heads, num_kv_heads)])
    num_blocks = sum(-(-(start + new) // block_size) for start, new in sequences) + 4
    attention = PagedAttention(1, num_blocks * block_size, num_kv_heads, head_dim, block_size, torch.bfloat16, torch.device("cpu"))
    free_blocks = torch.randperm(num_blocks, generator=rng).tolist()
    block_ids = [[free_blocks.pop() for _ in range(-(-(start + new) // block_size))] for start, new in sequences]
    cache = attention.kv_caches[0]

    def slots(i: int, positions: range) -> torch.Tensor:
        return torch.tensor([block_ids[i][p // block_size] * block_size + p % block_size for p in positions], dtype=torch.long)

    for i, (start, _) in enumerate(sequences):  # what earlier steps stored
        cache[0][:, slots(i, range(start))] = data[i][1][:start].transpose(0, 1)
        cache[1][:, slots(i, range(start))] = data[i][2][:start].transpose(0, 1)
    table = torch.zeros(max(len(decodes), 1), max(len(b) for b in block_ids), dtype=torch.long)
    for row, i in enumerate(decodes):
        table[row, : len(block_ids[i])] = torch.tensor(block_ids[i])
    prefills, flat = [], len(decodes)
    for i in order[len(decodes) :]:
        start, new = sequences[i]
        prefills.append(PrefillSpan(flat, new, start + new, torch.tensor(block_ids[i]), None))
        flat += new
    attention.metadata = AttentionMetadata(
        torch.cat([slots(i, range(sequences[i][0], sum(sequences[i]))) for i in order]), len(decodes),
        table if decodes else None, torch.tensor([sum(sequences[i]) for i in decodes]) if decodes else None, prefills,
    )
    out = attention.forward(
        0, *(torch.cat([data[i][j][sequences[i][0] :] for i in order]) for j in range(3)), window=window, sinks=sinks
    )
    first = sum(sequences[i][1] for i in order[: order.index(0)])
    return out[first : first + length - cached]


@needs_kernel
@pytest.mark.parametrize(("window", "has_sinks"), [(None, False), (8, False), (20, True), (None, True)])
def test_the_attention_kernel_gives_a_row_the_same_bits_however_its_step_holds_it(window: int | None, has_sinks: bool) -> None:
    """Also with a sliding window shorter than the sequence (its rows start at other keys than their
    chunk's or step's) and with attention sinks."""
    sinks = torch.linspace(-3.0, 4.0, 9).bfloat16() if has_sinks else None
    alone = target_rows(44, [], is_decode=True, seed=1, window=window, sinks=sinks)[0]
    decodes = [(300, 1), (3, 1), (17, 1)]
    whole = target_rows(0, [], is_decode=False, seed=2, window=window, sinks=sinks)
    assert torch.equal(whole[-1], alone)
    for cached, others, is_decode, seed in [
        (44, decodes, True, 3),  # a decode beside others
        (44, [*decodes, (0, 100), (16, 30)], True, 4),  # beside prompts too
        (0, [*decodes, (5, 60)], False, 5),  # the whole prompt, chunked from 0, beside decodes
        (7, [(0, 20)], False, 6),  # after a cached prefix that ends mid-block: chunks start elsewhere
        (32, [*decodes, (32, 13)], False, 7),  # after two cached blocks
    ]:
        rows = target_rows(cached, others, is_decode, seed, window=window, sinks=sinks)
        assert torch.equal(rows, whole[cached:]), (cached, others)


@needs_kernel
def test_the_norm_kernels_give_a_row_the_same_bits_in_any_batch() -> None:
    kernels = load_cpu_kernels()
    torch.manual_seed(0)
    x, residual = (torch.randn(70, 576) * torch.logspace(-2, 2, 70).unsqueeze(1)).bfloat16(), torch.randn(70, 576).bfloat16()
    weight = torch.randn(576).bfloat16()
    whole, whole_residual = kernels.rms_norm(x, weight, 1e-5), residual.clone()
    whole_added = kernels.add_rms_norm(x, whole_residual, weight, 1e-5)
    for first, num_rows in ((0, 1), (5, 3), (54, 16)):
        rows = slice(first, first + num_rows)
        assert torch.equal(kernels.rms_norm(x[rows].contiguous(), weight, 1e-5), whole[rows])
        part_residual = residual[rows].clone()
        assert torch.equal(kernels.add_rms_norm(x[rows].contiguous(), part_residual, weight, 1e-5), whole_added[rows])
        assert torch.equal(part_residual, whole_residual[rows])


def test_a_cpu_with_the_capability_loads_the_kernels_and_every_kernel_form() -> None:
    """Where a build exists for this CPU (and g++ is here), a build or trial-call failure is a failure,
    not the skip the kernel tests would take: they would blame the CPU for what broke."""
    features = cpu_features()
    if features.kernel_isa not in cpu_kernels._CFLAGS_BY_ISA or shutil.which("g++") is None:
        pytest.skip(f"no zeroserve kernel build for this CPU ({features.describe()}) or no g++")
    if not envs.cpu_kernels():
        pytest.skip("ZEROSERVE_CPU_KERNELS turns the kernels off")
    kernels = load_cpu_kernels()
    assert kernels is not None, f"the kernels failed to build or their trial call on {features.describe()} (see the log)"
    failing = [spec.name for spec in KERNEL_FORMS if spec.kernel is not None and not spec.kernel.trial(kernels)]
    assert not failing, f"kernel forms whose trial call fails on {features.describe()}: {failing}"
