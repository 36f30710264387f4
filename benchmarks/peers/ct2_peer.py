"""benchmarks/cpu_peers.py's CTranslate2 side (the `ctranslate2` wheel): the model converted
once from the same Hugging Face folder (float32; int8 is quantized by CTranslate2 when it
loads: `compute_type="int8"`, int8 weights and dynamically quantized int8 activations).

Batch 1 streams with `generate_tokens`; the 64 requests go to `generate_batch` at once
(`max_batch_size` 64: CTranslate2 batches them statically, padded, as its users do)."""

from __future__ import annotations

import pathlib
import time

import common


def converted(model: str) -> pathlib.Path:
    """The CTranslate2 copy of the HF folder `model` (made once, under .cache/peers/ct2)."""
    import ctranslate2

    dest = common.ROOT / ".cache" / "peers" / "ct2" / pathlib.Path(model).name
    if not (dest / "model.bin").is_file():
        ctranslate2.converters.TransformersConverter(model).convert(str(dest), quantization="float32",
                                                                    force=True)
    return dest


class CT2Peer:
    COMPUTE = {"fp32": "float32", "int8": "int8"}

    def __init__(self, model: str, precision: str):
        import ctranslate2
        from tokenizers import Tokenizer

        self.ct2 = ctranslate2
        self.path = str(converted(model))
        self.compute = self.COMPUTE[precision]
        self.tok = Tokenizer.from_file(str(pathlib.Path(model) / "tokenizer.json"))
        self.generators: dict[int, object] = {}
        self.gen = None

    def threads(self, n: int) -> None:
        # intra_threads is fixed when a Generator is made: one per thread count, kept
        if n not in self.generators:
            self.generators[n] = self.ct2.Generator(self.path, device="cpu", compute_type=self.compute,
                                                    intra_threads=n, inter_threads=1)
        self.gen = self.generators[n]

    def _tokens(self, ids: list[int]) -> list[str]:
        return [self.tok.id_to_token(i) for i in ids]

    def stream(self, prompt: list[int], tokens: int) -> dict:
        out, wall, cpu = [], [], []
        for step in self.gen.generate_tokens(self._tokens(prompt), max_length=tokens, sampling_topk=1,
                                             end_token=[]):
            wall.append(time.perf_counter())
            cpu.append(time.process_time())
            out.append(step.token_id)
        return {"tokens": out, "wall": wall, "cpu": cpu}

    def batch(self, prompts: list[list[int]], tokens: int) -> list[list[int]]:
        res = self.gen.generate_batch([self._tokens(p) for p in prompts], max_batch_size=len(prompts),
                                      max_length=tokens, sampling_topk=1, end_token=[],
                                      include_prompt_in_result=False)
        return [r.sequences_ids[0] for r in res]
