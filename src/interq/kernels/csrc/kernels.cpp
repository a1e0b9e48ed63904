// interq's compiled CPU kernels: src/interq/kernels/__init__.py builds this file (one translation unit) and
// loads it. Each topic is a header in this folder, included below in dependency order.
//
// Each kernel is one pass over memory that replaces a chain of eager PyTorch ops, with the SAME values, bit for
// bit (tests/test_quant_kernels.py compares them with the eager primitives on awkward inputs):
//   quant_act_int8: interq.quant.primitives.quant_act_int8_token, rounding half_even (vLLM dynamic_scaled_int8_quant)
//   epilogue:       interq.quant.linear.epilogue without bias (CUTLASS ScaledEpilogue), one output per member
//                   of a fused q|k|v or gate|up group, each contiguous, already in the compute dtype
//   int8_gemm_vnni: torch._int_mm's exact int32 accumulator from weights packed by pack_int8_vnni (AVX512-VNNI)
//   int8_gemm_avx2: the same accumulator from the same packed weights on AVX2 without VNNI (int16 products)
//   int8_gemm_amx:  the same accumulator from the same packed weights by AMX-INT8 tiles, any number of rows
//   int8_linear_amx: quant_act_int8, int8_gemm_amx and epilogue in one call, the same values
//   int8_linear_avx2: quant_act_int8, int8_gemm_avx2 and epilogue in one call, the same values
//   bf16_linear_amx: F.linear of bf16 by AMX-BF16 tiles, oneDNN's sums where the caller's probe says so
//   bf16_linear_avx2: F.linear of bf16 where torch runs its reference kernel (no native bf16), its sums, 16 columns at once
//   rms_norm_bf16:  transformers' Llama / Qwen RMSNorm of bf16 rows with torch's summation order (interq.kernels.rms_norm)
//   flash_decode_amx: torch's CPU flash attention of bf16 decode rows (oneDNN's AMX-BF16 sums), in one call
//   causal_attention_fwd / _bwd: NOT an eager chain's bits: the learner's causal GQA attention and its gradient,
//                   fp32, for train.learner_attention=kernel

#include "common.h"
#include "quant.h"
#include "int8_gemm.h"
#include "int8_amx.h"
#include "bf16_linear.h"
#include "rms_norm.h"
#include "causal_attention.h"
#include "flash_decode.h"
