"""Input-size limits: count a request's input tokens and, when asked, cut the middle of an
over-long prompt. Pure functions over the parsed JSON body; no I/O.

Counting (per prompt, the unit the engine limits):
- a token-id prompt (`"prompt": [ids...]`) has exactly `len(prompt)` tokens;
- a text prompt has `tokenizer(text)` tokens when a tokenizer is configured, else the estimate
  `ceil(utf8_bytes / 4)` (OpenAI's rule of thumb: about 4 characters of English text per token);
- a chat request counts the text of every message (string content or `{"type": "text"}` parts);
  the chat template's own tokens are not counted, so the limit is a few tokens generous there.

Truncation `middle` keeps the head and the tail of the prompt (half of the budget each, the head
one token longer when odd): the instructions at the start and the question at the end survive,
which is what "lost in the middle" (Liu et al., 2023) says models use least.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tailtrace.plumbing.errors import UserError

__all__ = ["LimitError", "TokenCounter", "cap_output", "check_input"]


class LimitError(ValueError):
    """A request the gateway refuses before admission. Carries the HTTP `status` (400 or 413), the
    OpenAI error `code` and `param`, and a one-line `message` for the client."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


class TokenCounter:
    """Counts and cuts text in tokens: exactly with a Hugging Face `tokenizers` file, else by the
    bytes/4 estimate. `path` is a tokenizer.json or a folder holding one.

    Raises `UserError` when `path` is given but holds no readable tokenizer.
    """

    def __init__(self, path: str | None = None):
        self._tok = None
        if path:
            p = Path(path)
            if p.is_dir():
                p = p / "tokenizer.json"
            try:
                from tokenizers import Tokenizer

                self._tok = Tokenizer.from_file(str(p))
            except Exception as exc:  # noqa: BLE001 - file missing, not JSON, not a tokenizer
                raise UserError(f"--tokenizer {path!r}: cannot load a tokenizer.json ({exc})") from None

    @property
    def exact(self) -> bool:
        """True when counts come from a real tokenizer, False for the bytes/4 estimate."""
        return self._tok is not None

    def count(self, text: str) -> int:
        """Tokens in `text` (exact or estimated, see the module doc)."""
        if self._tok is not None:
            return len(self._tok.encode(text, add_special_tokens=False).ids)
        return math.ceil(len(text.encode("utf-8", "surrogatepass")) / 4)

    def cut_middle(self, text: str, keep: int) -> str:
        """`text` with its middle removed so that about `keep` tokens remain (head and tail)."""
        if keep <= 0:
            return ""
        head_n, tail_n = keep - keep // 2, keep // 2
        if self._tok is not None:
            enc = self._tok.encode(text, add_special_tokens=False)
            n = len(enc.ids)
            out = text
            for target in range(keep, max(keep - 4, 0), -1):  # the seam can re-merge: retry a token shorter
                if n <= target:
                    return text
                head_n, tail_n = target - target // 2, target // 2
                head_end = enc.offsets[head_n - 1][1] if head_n else 0
                tail_start = enc.offsets[n - tail_n][0] if tail_n else len(text)
                out = text[:head_end] + text[tail_start:]
                if self.count(out) <= keep:
                    return out
            return out
        data = text.encode("utf-8", "surrogatepass")
        head_b, tail_b = head_n * 4, tail_n * 4
        if len(data) <= head_b + tail_b:
            return text
        tail = data[len(data) - tail_b:] if tail_b else b""
        # errors="ignore" drops a character split by the cut, so the result stays within budget.
        return (data[:head_b] + tail).decode("utf-8", "ignore")


def _cut_ids(ids: list, keep: int) -> list:
    head_n, tail_n = keep - keep // 2, keep // 2
    return ids[:head_n] + (ids[len(ids) - tail_n:] if tail_n else [])


def _is_ids(x) -> bool:
    # The first element decides (a full scan of a 100k-token prompt would cost a millisecond);
    # the engine validates every id anyway.
    return isinstance(x, list) and (not x or type(x[0]) is int)


def _prompts(body: dict) -> list:
    """The prompts of a /v1/completions body as a list of str or list[int]; raises LimitError."""
    p = body.get("prompt")
    if p is None:
        return []
    if isinstance(p, str) or _is_ids(p):
        return [p]
    if isinstance(p, list) and all(isinstance(x, str) or _is_ids(x) for x in p):
        return list(p)
    raise LimitError(400, "'prompt' must be a string, an array of token ids, or an array of those",
                     "invalid_prompt", "prompt")


def _chat_parts(body: dict) -> list[tuple[dict, str]]:
    """(holder, key) pairs whose holder[key] is message text, for /v1/chat/completions."""
    msgs = body.get("messages")
    if msgs is None:
        return []
    if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
        raise LimitError(400, "'messages' must be an array of message objects", "invalid_messages", "messages")
    out = []
    for m in msgs:
        c = m.get("content")
        if isinstance(c, str):
            out.append((m, "content"))
        elif isinstance(c, list):
            for part in c:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    out.append((part, "text"))
    return out


@dataclass
class InputCheck:
    """What `check_input` found: `input_tokens` (largest prompt, after truncation), whether the
    body was changed, and `truncated_tokens` removed in all (0 when none)."""

    input_tokens: int
    changed: bool = False
    truncated_tokens: int = 0


def check_input(body: dict, kind: str, counter: TokenCounter, max_tokens: int, truncate: str) -> InputCheck:
    """Count the input tokens of a parsed request body and enforce `max_tokens`.

    `kind` is "completions" or "chat"; `truncate` is "off" or "middle". With "middle" the body is
    edited in place (each over-long prompt, or the longest chat texts, cut in the middle).
    Raises `LimitError` (400, code `context_length_exceeded`) when over the limit and truncation is
    off, or (400, `invalid_prompt`/`invalid_messages`) when the prompt has a shape no engine accepts.
    """
    if kind == "completions":
        prompts = _prompts(body)
        counts = [len(p) if isinstance(p, list) else counter.count(p) for p in prompts]
        biggest = max(counts, default=0)
        if biggest <= max_tokens:
            return InputCheck(biggest)
        if truncate != "middle":
            raise LimitError(400, f"the prompt has {biggest} tokens{'' if counter.exact else ' (estimated)'}, "
                             f"over this gateway's limit of {max_tokens} (--max-input-tokens); shorten it or "
                             "ask for --truncate middle", "context_length_exceeded", "prompt")
        removed, new = 0, []
        for p, n in zip(prompts, counts):
            if n > max_tokens:
                p = _cut_ids(p, max_tokens) if isinstance(p, list) else counter.cut_middle(p, max_tokens)
                n2 = len(p) if isinstance(p, list) else counter.count(p)
                removed += n - n2
                n = n2
            new.append((p, n))
        body["prompt"] = new[0][0] if (isinstance(body["prompt"], str) or _is_ids(body["prompt"])) else [p for p, _ in new]
        return InputCheck(max(n for _, n in new), True, removed)

    parts = _chat_parts(body)
    counts = [counter.count(h[k]) for h, k in parts]
    total = sum(counts)
    if total <= max_tokens:
        return InputCheck(total)
    if truncate != "middle":
        raise LimitError(400, f"the messages have {total} tokens{'' if counter.exact else ' (estimated)'}, "
                         f"over this gateway's limit of {max_tokens} (--max-input-tokens); shorten them or "
                         "ask for --truncate middle", "context_length_exceeded", "messages")
    excess, removed = total - max_tokens, 0
    for i in sorted(range(len(parts)), key=lambda j: -counts[j]):  # longest texts first
        if excess <= 0:
            break
        holder, key = parts[i]
        keep = max(counts[i] - excess, 0)
        holder[key] = counter.cut_middle(holder[key], keep)
        n2 = counter.count(holder[key])
        excess -= counts[i] - n2
        removed += counts[i] - n2
    return InputCheck(total - removed, True, removed)


_OUTPUT_KEYS = ("max_tokens", "max_completion_tokens")


def cap_output(body: dict, cap: int | None) -> bool:
    """Lower the parsed request body's `max_tokens` / `max_completion_tokens` to `cap` tokens (the
    gateway's --max-output-tokens), setting `max_tokens` where the body gives neither. Returns True
    when the body changed. A value that is not an integer is left for the engine to refuse (400)."""
    if cap is None:
        return False
    changed = False
    present = [k for k in _OUTPUT_KEYS if k in body and body[k] is not None]
    for k in present:
        v = body[k]
        if isinstance(v, int) and not isinstance(v, bool) and v > cap:
            body[k] = cap
            changed = True
    if not present:
        body["max_tokens"] = cap
        changed = True
    return changed
