"""Seventeenth session, an experiment (not in interq): how much of the engine's decode step is transformers' module
glue? A Llama-family decode forward written as the same ops in the same order (HF's own rotary and mask functions,
the executor's modules' forward methods called directly, interq's sdpa_packed attention), checked bit for bit
against the model's forward, then both timed interleaved on SmolLM2's bf16 executor (16 rows, ~250 cached tokens).
Usage: lean_forward.py [THREADS]"""
import statistics
import sys
import time

import torch
from transformers.masking_utils import create_causal_mask
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from interq.machine import describe, machine_info
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, make_executor
from interq.rollout.attention import sdpa_packed_attention, set_rollout_attention
from interq.rollout.engine import dynamic_cache_factory, forward_step

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)
print(describe(machine_info()), flush=True)
learner, _ = load_smollm2(torch.bfloat16)
exe = set_rollout_attention(make_executor(learner, BF16_EXECUTOR), "sdpa_packed")


def rms(norm, x):
    dt = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + norm.variance_epsilon)
    return norm.weight * h.to(dt)


def lean(model, cache, input_ids, attention_mask, position_ids):
    m = model.model
    h = m.embed_tokens.forward(input_ids)
    mask = create_causal_mask(config=m.config, inputs_embeds=h, attention_mask=attention_mask, cache=cache,
                              position_ids=position_ids)
    cos, sin = m.rotary_emb(h, position_ids=position_ids)
    b, t, _ = h.shape
    for layer in m.layers:
        a = layer.self_attn
        d = a.head_dim
        x = rms(layer.input_layernorm, h)
        q = a.q_proj.forward(x).view(b, t, -1, d).transpose(1, 2)
        k = a.k_proj.forward(x).view(b, t, -1, d).transpose(1, 2)
        v = a.v_proj.forward(x).view(b, t, -1, d).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = cache.update(k, v, a.layer_idx)
        o, _ = sdpa_packed_attention(a, q, k, v, mask, scaling=a.scaling)
        h = h + a.o_proj.forward(o.reshape(b, t, -1).contiguous())
        x = rms(layer.post_attention_layernorm, h)
        mlp = layer.mlp
        h = h + mlp.down_proj.forward(mlp.act_fn(mlp.gate_proj.forward(x)) * mlp.up_proj.forward(x))
    h = rms(m.norm, h)
    return model.lm_head.forward(h[:, -1:, :].contiguous())[:, -1, :].float()


g = torch.Generator().manual_seed(0)
B, P = 16, 250
prompt = torch.randint(10, 49000, (B, P), generator=g)
with torch.inference_mode():
    caches = {}
    for name in ("hf", "lean"):
        c = dynamic_cache_factory(exe.config)
        forward_step(exe, c, prompt, torch.ones(B, P, dtype=torch.long), torch.arange(P)[None].expand(B, -1))
        caches[name] = c
    mask = torch.ones(B, P, dtype=torch.long)
    pos = P
    times = {"hf": [], "lean": []}
    same = True
    tok = torch.randint(10, 49000, (B, 1), generator=g)
    for step in range(40):
        mask = torch.cat([mask, torch.ones(B, 1, dtype=torch.long)], dim=1)
        pids = torch.full((B, 1), pos)
        outs = {}
        for name in (("hf", "lean") if step % 2 == 0 else ("lean", "hf")):
            t0 = time.perf_counter()
            if name == "hf":
                outs[name] = forward_step(exe, caches[name], tok, mask, pids)
            else:
                outs[name] = lean(exe, caches[name], tok, mask, pids)
            times[name].append(time.perf_counter() - t0)
        same &= torch.equal(outs["hf"], outs["lean"])
        tok = outs["hf"].argmax(-1, keepdim=True)
        pos += 1
hf, ln = statistics.median(times["hf"][5:]), statistics.median(times["lean"][5:])
print(f"decode step, 16 rows, {P}-{pos} cached: HF forward {hf * 1e3:.1f} ms, lean {ln * 1e3:.1f} ms "
      f"({hf / ln:.2f}x, {1e3 * (hf - ln):.1f} ms of glue); same logits every step: {same}")
