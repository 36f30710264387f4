"""How an embedding model turns hidden states into one vector: its sentence-transformers
configuration, read from the model folder, and the pooling itself.

A sentence-transformers folder says it in files (as `SentenceTransformer(folder)` reads them):

    modules.json               the pipeline: Transformer -> Pooling [-> Dense] [-> Normalize]
    1_Pooling/config.json      pooling_mode_{mean_tokens,cls_token,lasttoken,max_tokens,
                               mean_sqrt_len_tokens}, include_prompt
    sentence_bert_config.json  max_seq_length (inputs are cut there, as it cuts them)
    config_sentence_transformers.json   prompts {name: text}, default_prompt_name

A folder without them is a plain checkpoint: an encoder pools mean, a decoder its last
token (Qwen3-Embedding, gte-Qwen2, e5-mistral), neither normalises unless told.

NOTE: never silently wrong. A module this engine does not run (Dense, a second Transformer,
a custom module) or a pooling mode it does not implement refuses to load, naming it.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from inflight.engine.errors import ModelError

POOLING_MODES = ("mean", "cls", "lasttoken", "max", "mean_sqrt_len")
_ST_MODE_KEYS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                 "pooling_mode_lasttoken": "lasttoken", "pooling_mode_max_tokens": "max",
                 "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len"}
_ST = "sentence_transformers.models."
_KNOWN_MODULES = {_ST + "Transformer", _ST + "Pooling", _ST + "Normalize",
                  # sentence-transformers >= 5 spells them by their new homes too
                  _ST + "transformer.Transformer", _ST + "pooling.Pooling",
                  _ST + "normalize.Normalize"}


@dataclass(frozen=True)
class PoolingConfig:
    """`mode`: one of POOLING_MODES; `normalize`: L2-normalise the vector (after any
    `dimensions` cut); `max_seq_length`: inputs are cut to it (None: the model context);
    `prompts`: named prefixes, `default_prompt`: the one used when a request names none
    (None: no prefix); `dimension`: the vector's full size (None until the model says)."""

    mode: str = "lasttoken"
    normalize: bool = False
    max_seq_length: int | None = None
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt: str | None = None
    dimension: int | None = None
    sentence_transformers: bool = False  # read from a sentence-transformers folder

    def __post_init__(self) -> None:
        if self.mode not in POOLING_MODES:
            raise ModelError(f"pooling mode {self.mode!r} is not one of {POOLING_MODES}")

    def with_overrides(self, **changes) -> PoolingConfig:
        """The config with the non-None `changes` applied (EngineConfig / settings overrides)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def prompt_text(self, name: str | None) -> str:
        """The prefix for prompt `name` (None: the default prompt, if any)."""
        if name is None:
            return self.prompts.get(self.default_prompt, "") if self.default_prompt else ""
        if name not in self.prompts:
            raise ModelError(f"the model has no prompt named {name!r}; its prompts: "
                             f"{sorted(self.prompts) or 'none'}")
        return self.prompts[name]


def is_sentence_transformers_folder(folder: pathlib.Path) -> bool:
    return (folder / "modules.json").is_file()


def read_pooling_config(folder: str | pathlib.Path, default_mode: str) -> PoolingConfig:
    """The pooling a folder asks for (sentence-transformers files), else `default_mode`."""
    folder = pathlib.Path(folder)
    if not is_sentence_transformers_folder(folder):
        return PoolingConfig(mode=default_mode)
    modules = json.loads((folder / "modules.json").read_text())
    mode, normalize, dim = default_mode, False, None
    for m in sorted(modules, key=lambda m: m.get("idx", 0)):
        kind = m.get("type", "")
        if kind not in _KNOWN_MODULES:
            raise ModelError(f"{folder}/modules.json has a {kind!r} module that this engine does not "
                             "run (it runs Transformer, Pooling and Normalize): the vectors would differ")
        name = kind.rsplit(".", 1)[-1]
        if name == "Transformer" and m.get("path", "") not in ("", "."):
            raise ModelError(f"{folder}/modules.json puts the Transformer in {m['path']!r}; the engine "
                             "reads the weights from the folder itself")
        if name == "Normalize":
            normalize = True
        if name == "Pooling":
            mode, dim = _read_pooling_module(folder / m.get("path", "1_Pooling"))
    st = _read_json(folder / "sentence_bert_config.json")
    cfg = _read_json(folder / "config_sentence_transformers.json")
    prompts = cfg.get("prompts") or {}
    default = cfg.get("default_prompt_name")
    return PoolingConfig(mode=mode, normalize=normalize, max_seq_length=st.get("max_seq_length"),
                         prompts=dict(prompts), default_prompt=default or None, dimension=dim,
                         sentence_transformers=True)


def _read_pooling_module(path: pathlib.Path) -> tuple[str, int | None]:
    cfg = _read_json(path / "config.json")
    if "pooling_mode" in cfg:  # sentence-transformers 5 may write the mode by name
        modes = [cfg["pooling_mode"]]
    else:
        modes = [mode for key, mode in _ST_MODE_KEYS.items() if cfg.get(key)]
    modes = ["mean" if m == "mean_tokens" else "cls" if m == "cls_token" else m for m in modes]
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise ModelError(f"{path}/config.json asks for pooling {modes or 'none'}: the engine pools "
                         f"with exactly one of {POOLING_MODES} (concatenated modes are not run)")
    for key in ("pooling_mode_weightedmean_tokens",):
        if cfg.get(key):
            raise ModelError(f"{path}/config.json sets {key}, which the engine does not run")
    if cfg.get("include_prompt") is False and modes[0] != "lasttoken":
        raise ModelError(f"{path}/config.json sets include_prompt false (pool without the prompt's "
                         "tokens), which the engine does not run")
    return modes[0], cfg.get("word_embedding_dimension")


def _read_json(path: pathlib.Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


# -- the pooling ----------------------------------------------------------------------------
def pool(hidden: torch.Tensor, starts: list[int], ends: list[int], mode: str) -> torch.Tensor:
    """hidden [T, H] of whole sequences, sequence i in rows starts[i]:ends[i] -> [n, H] fp32.

    (A decoder's chunked sequence pools through `PoolState` instead.)"""
    h = hidden.float()
    if mode == "cls":
        return h[starts]
    if mode == "lasttoken":
        return h[[e - 1 for e in ends]]
    dev = h.device
    lens = torch.tensor([e - s for s, e in zip(starts, ends)], dtype=torch.float32, device=dev)
    if mode == "max":
        return torch.stack([h[s:e].max(0).values for s, e in zip(starts, ends)])
    # sum per sequence in one op: a segment sum over the flattened rows
    seg = torch.repeat_interleave(torch.arange(len(starts), device=dev), lens.long())
    sums = torch.zeros(len(starts), h.shape[1], dtype=torch.float32, device=dev).index_add_(0, seg, h)
    if mode == "mean":
        return sums / lens[:, None]
    return sums / lens.sqrt()[:, None]  # mean_sqrt_len


@dataclass
class PoolState:
    """A chunked sequence's pooling so far (a decoder prefills long inputs in chunks):
    the running sum / max / first row over the chunks computed, and the token count."""

    total: torch.Tensor | None = None
    count: int = 0

    def add(self, rows: torch.Tensor, mode: str, first_chunk: bool) -> None:
        rows = rows.float()
        if mode == "cls":
            if first_chunk:
                self.total = rows[0].clone()
        elif mode == "lasttoken":
            self.total = rows[-1].clone()
        elif mode == "max":
            m = rows.max(0).values
            self.total = m if self.total is None else torch.maximum(self.total, m)
        else:
            s = rows.sum(0)
            self.total = s if self.total is None else self.total + s
        self.count += rows.shape[0]

    def result(self, mode: str) -> torch.Tensor:
        if mode == "mean":
            return self.total / self.count
        if mode == "mean_sqrt_len":
            return self.total / self.count ** 0.5
        return self.total


def finish_vector(v: torch.Tensor, dimensions: int | None, normalize: bool) -> torch.Tensor:
    """Cut a pooled vector [..., H] to `dimensions` (Matryoshka), then L2-normalise it when
    the model normalises (so a cut vector has unit length again)."""
    if dimensions is not None:
        v = v[..., :dimensions]
    if normalize:
        v = F.normalize(v, p=2, dim=-1)
    return v
