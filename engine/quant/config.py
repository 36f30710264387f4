"""The `quantization` section of a quantized model folder's config.json.

    "quantization": {"format": "inflight", "version": 1, "scheme": "w4", "bits": 4,
                     "group_size": 128, "symmetric": false, "method": "gptq",
                     "modules": ["self_attn.q_proj", ...], "calibration": {...}}

Schemes (tensor layouts in kernels/quant.py):
- `w8`: per-output-channel symmetric int8 (`<name>.qweight` int8 [N, K], `<name>.scales` fp16 [N]).
- `w4`: group-wise asymmetric int4 along K, groups of 128 (default), 64 or 32
  (`.qweight` uint8 [N, K/2] two values per byte, `.scales` fp16 [N, G], `.qzeros` uint8 [N, G]).
Only the decoder layers' seven projections are quantized; embeddings, norms and the LM
head stay 16-bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inflight.engine.errors import ConfigError, ModelError

SCHEMES = ("w8", "w4")
METHODS = ("rtn", "gptq")
GROUP_SIZES = (32, 64, 128)
FORMAT, VERSION = "inflight", 1
# the projections of one decoder layer that are quantized, in the order GPTQ visits them
LINEAR_NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


@dataclass(frozen=True)
class QuantConfig:
    scheme: str
    group_size: int | None = None   # w4 only (default 128)
    method: str = "rtn"
    calibration: dict = field(default_factory=dict, compare=False)  # provenance, for people

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ConfigError(f"quantization scheme {self.scheme!r} is not supported; use one of {SCHEMES}")
        if self.method not in METHODS:
            raise ConfigError(f"quantization method {self.method!r} is not supported; use one of {METHODS}")
        if self.scheme == "w4":
            if self.group_size is None:
                object.__setattr__(self, "group_size", 128)
            if self.group_size not in GROUP_SIZES:
                raise ConfigError(f"w4 group size {self.group_size} is not supported; use one of {GROUP_SIZES}")
        elif self.group_size is not None:
            raise ConfigError(f"w8 is per output channel: it takes no group size (got {self.group_size})")

    @property
    def bits(self) -> int:
        return 8 if self.scheme == "w8" else 4

    @property
    def symmetric(self) -> bool:
        return self.scheme == "w8"

    @property
    def label(self) -> str:
        return self.scheme + (f"-g{self.group_size}" if self.group_size else "") + f"-{self.method}"

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "scheme": self.scheme, "bits": self.bits,
                "group_size": self.group_size, "symmetric": self.symmetric, "method": self.method,
                "modules": list(LINEAR_NAMES), "calibration": self.calibration}


def read_quant_config(config: dict, where: object) -> QuantConfig | None:
    """The QuantConfig of a parsed config.json, None for an unquantized model. Checkpoints
    quantized by other tools (`quantization_config`: GPTQ, AWQ, bitsandbytes...) are refused
    with a clear message instead of being loaded as garbage."""
    foreign = config.get("quantization_config")
    if foreign is not None:
        method = foreign.get("quant_method", "?") if isinstance(foreign, dict) else "?"
        raise ModelError(f"{where}: quantized by another tool (quantization_config, quant_method "
                         f"{method!r}); the engine loads unquantized checkpoints and its own "
                         "`inflight quantize` folders")
    q = config.get("quantization")
    if q is None:
        return None
    if not isinstance(q, dict) or q.get("format") != FORMAT or q.get("version") != VERSION:
        raise ModelError(f"{where}: config.json 'quantization' is not an {FORMAT} v{VERSION} "
                         f"section ({q!r:.200}); re-create the folder with `inflight quantize`")
    if tuple(q.get("modules", ())) != LINEAR_NAMES:
        raise ModelError(f"{where}: quantized modules {q.get('modules')} differ from {list(LINEAR_NAMES)}")
    try:
        return QuantConfig(q.get("scheme"), q.get("group_size"), q.get("method", "rtn"),
                           q.get("calibration") or {})
    except ConfigError as exc:
        raise ModelError(f"{where}: {exc}") from None
