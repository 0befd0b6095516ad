"""Exact-shape request bodies: token-id prompts of the trace's input length, `max_tokens` = the
trace's output length with `ignore_eos`, and Mooncake prefix sharing.

Prompt content: the prompt is a sequence of 512-token blocks. A Mooncake `hash_id` h names a
block whose ids are a pure function of (seed, h), so the same hash id gives the same 512 ids in
every request that carries it, and vLLM's prefix cache sees the sharing the trace recorded.
Requests without hash ids (Azure) get blocks keyed by their own request index, so two requests
never share a prefix by accident. Ids are drawn from [low, high) (default [3, 2000): clear of the
usual special ids 0..2 and inside any vocabulary of at least 2000 tokens).

Ids come from splitmix64 (Steele et al., "Fast splittable pseudorandom number generators",
OOPSLA 2014) over (seed, block key, position): vectorised, no state, identical on every run.
"""

from __future__ import annotations

import json
from collections import OrderedDict

import numpy as np

from tailtrace.loadgen.traces import MOONCAKE_BLOCK_TOKENS

__all__ = ["PromptBuilder", "RequestShape"]

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class RequestShape:
    """The shape actually sent for one trace request.

    input_tokens / output_tokens: lengths sent (after clipping); trace_input_tokens: the
    trace's length; clipped: True when the input was cut to fit the model.
    """

    __slots__ = ("clipped", "input_tokens", "output_tokens", "trace_input_tokens")

    def __init__(self, input_tokens: int, output_tokens: int, trace_input_tokens: int, clipped: bool):
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.trace_input_tokens = trace_input_tokens
        self.clipped = clipped


class PromptBuilder:
    """Builds `/v1/completions` JSON bodies (bytes) for trace requests.

    model: the `model` field. seed: content seed. token_range: [low, high) of prompt ids.
    max_input: cap on prompt tokens (None: no cap). max_model_len: when known, the prompt is also
    cut to max_model_len - max_tokens so that vLLM accepts it (and max_tokens to
    max_model_len - 1). cache_blocks: how many encoded 512-token blocks to keep (LRU).
    Cost: about 30 us per uncached block, a string join per request; safe to call from the
    event loop between sends.
    """

    def __init__(
        self, model: str, *, seed: int = 0, token_range: tuple[int, int] = (3, 2000),
        max_input: int | None = None, max_model_len: int | None = None,
        extra_body: dict | None = None, cache_blocks: int = 4096,
    ):
        low, high = token_range
        if not 0 <= low < high:
            raise ValueError("token_range must be 0 <= low < high")
        self.model = model
        self.seed = int(seed) & 0xFFFFFFFF
        self.low, self.span = low, high - low
        self.max_input = max_input
        self.max_model_len = max_model_len
        self._cache: OrderedDict[int, str] = OrderedDict()
        self._cache_blocks = cache_blocks
        self._pos = np.arange(MOONCAKE_BLOCK_TOKENS, dtype=np.uint64)
        extra = dict(extra_body or {})
        self._tail = json.dumps(extra)[1:-1] if extra else ""

    def block_ids(self, key: int) -> list[int]:
        """The 512 ids of block `key` (a Mooncake hash id >= 0, or a private key < 0)."""
        k = np.uint64((self.seed << 32) ^ (key & 0xFFFFFFFFFFFF) ^ (0x8000_0000_0000 if key < 0 else 0))
        with np.errstate(over="ignore"):
            x = _splitmix64(k * np.uint64(MOONCAKE_BLOCK_TOKENS) + self._pos)
        return (x % np.uint64(self.span) + np.uint64(self.low)).astype(np.int64).tolist()

    def _block_text(self, key: int) -> str:
        text = self._cache.get(key)
        if text is not None:
            self._cache.move_to_end(key)
            return text
        text = ",".join(map(str, self.block_ids(key)))
        if key >= 0:  # only shared blocks are worth keeping
            self._cache[key] = text
            if len(self._cache) > self._cache_blocks:
                self._cache.popitem(last=False)
        return text

    def shape(self, input_tokens: int, output_tokens: int) -> RequestShape:
        """Clip (input, output) to the model: input <= max_input and input + output <= max_model_len."""
        n_out = output_tokens
        if self.max_model_len is not None:
            n_out = max(1, min(n_out, self.max_model_len - 1))
        n_in = input_tokens
        if self.max_input is not None:
            n_in = min(n_in, self.max_input)
        if self.max_model_len is not None:
            n_in = min(n_in, self.max_model_len - n_out)
        n_in = max(1, n_in)
        return RequestShape(n_in, n_out, input_tokens, n_in < input_tokens)

    def prompt_text(self, index: int, n_in: int, hash_ids: tuple[int, ...] = ()) -> str:
        """The prompt's ids as JSON array text (without brackets): `n_in` ids.

        Block b uses hash_ids[b] when the trace gives one, else the private key of (index, b).
        """
        parts = []
        full, rest = divmod(n_in, MOONCAKE_BLOCK_TOKENS)
        nblocks = full + (1 if rest else 0)
        for b in range(nblocks):
            key = hash_ids[b] if b < len(hash_ids) else -(index * 4096 + b) - 1
            if b == full:  # the partial last block: a prefix of the same block's ids
                parts.append(",".join(map(str, self.block_ids(key)[:rest])))
            else:
                parts.append(self._block_text(key))
        return ",".join(parts)

    def body(self, index: int, shape: RequestShape, hash_ids: tuple[int, ...] = ()) -> bytes:
        """The JSON body (bytes) of a streamed `/v1/completions` request of exactly this shape."""
        text = (
            '{"model":' + json.dumps(self.model)
            + ',"prompt":[' + self.prompt_text(index, shape.input_tokens, hash_ids) + ']'
            + ',"max_tokens":' + str(shape.output_tokens)
            + ',"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}'
            + (',' + self._tail if self._tail else '') + '}'
        )
        return text.encode()
