"""What the deployment does with a request or a configuration before any step runs: vLLM's own
refusals, so the simulator never serves what the engine would refuse.

- **A configuration vLLM refuses** (`check_vllm_config`): the rules of vLLM's
  `SchedulerConfig.verify_max_model_len` (vllm/config/scheduler.py, 0.32; the installed source is the
  reference), with vLLM's own reason. Without chunked prefill a budget below `max_model_len` is refused
  there: vLLM would turn away every longer sequence.
- **Requests longer than the model** (`fit_to_model_len`): `max_model_len` bounds prompt + output.
  `cut` (the default) sends them as `tailtrace replay` and `try` do (loadgen.prompts.PromptBuilder.shape:
  output to max_model_len − 1, prompt to max_model_len − output); `refuse` as vLLM answers a client that
  sends them as they are (vllm/entrypoints/serve/utils/api_utils.py `get_max_tokens`: a prompt of
  max_model_len tokens or more is HTTP 400, a max_tokens beyond max_model_len is 400, otherwise the
  output is clamped to max_model_len − prompt).
"""

from __future__ import annotations

import numpy as np

from tailtrace.plumbing.errors import UserError

__all__ = ["OVER_LONG_MODES", "check_vllm_config", "fit_to_model_len", "over_long_line"]

OVER_LONG_MODES = ("cut", "refuse")


def check_vllm_config(engine, max_model_len: int | None, changes: list[str] | None = None) -> None:
    """Refuse (UserError, one line, vLLM's reason) an EngineConfig that vLLM 0.32 refuses at start:
    without chunked prefill a token budget below max_model_len; a budget below max_num_seqs (also
    EngineConfig's own check); a long-prefill threshold above max_model_len. `max_model_len` None
    (not recorded): the rules that need it are not checked (the engine then refuses, per request,
    a prompt that can never fit the budget). `changes`: the `--set` items, named in the message."""
    why = None
    if max_model_len is not None and engine.max_num_batched_tokens < max_model_len and not engine.enable_chunked_prefill:
        why = (f"max_num_batched_tokens ({engine.max_num_batched_tokens}) is smaller than max_model_len "
               f"({max_model_len}). This effectively limits the maximum sequence length to max_num_batched_tokens "
               "and makes vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease "
               f"max_model_len (here: add --set max_num_batched_tokens={max_model_len})")
    elif engine.max_num_batched_tokens < engine.max_num_seqs:
        why = (f"max_num_batched_tokens ({engine.max_num_batched_tokens}) must be greater than or equal to "
               f"max_num_seqs ({engine.max_num_seqs})")
    elif max_model_len is not None and engine.long_prefill_token_threshold > max_model_len:
        why = (f"long_prefill_token_threshold ({engine.long_prefill_token_threshold}) cannot be greater than the "
               f"max_model_len ({max_model_len})")
    if why:
        what = f"--set {' --set '.join(changes)}" if changes else "the recorded configuration"
        raise UserError(f"{what}: vLLM refuses this configuration: {why}")


def fit_to_model_len(traffic, max_model_len: int | None, mode: str = "cut"):
    """(traffic as the deployment serves it, report). `mode` "cut" or "refuse" (module docstring).
    The report: {"max_model_len", "mode", "requests", "over" (requests whose prompt + output exceed
    max_model_len), "cut", "refused", "text"}; with max_model_len None nothing is changed and "text"
    says over-long requests were not checked. Refused requests are marked in the returned traffic's
    `refused` (bool array). Raises ValueError on another mode."""
    from tailtrace.simulate.cluster import Traffic

    if mode not in OVER_LONG_MODES:
        raise ValueError(f"mode must be one of {OVER_LONG_MODES}, not {mode!r}")
    n = len(traffic)
    rep = {"max_model_len": max_model_len, "mode": mode, "requests": n, "over": 0, "cut": 0, "refused": 0}
    if max_model_len is None:
        rep["text"] = "max_model_len not recorded: requests longer than the model are not checked (served as given)"
        return traffic, rep
    mml = int(max_model_len)
    p, o = traffic.prompt.astype(np.int64), traffic.output.astype(np.int64)
    over = p + o > mml
    rep["over"] = int(over.sum())
    refused = np.zeros(n, dtype=bool) if traffic.refused is None else traffic.refused.copy()
    if mode == "cut":  # loadgen.prompts.PromptBuilder.shape
        o2 = np.maximum(1, np.minimum(o, mml - 1))
        p2 = np.maximum(1, np.minimum(p, mml - o2))
        rep["cut"] = int(((p2 < p) | (o2 < o)).sum())
    else:  # vLLM's get_max_tokens: refused when the prompt leaves no room or max_tokens alone is too long
        bad = (p >= mml) | (o > mml)
        refused |= bad
        p2, o2 = p, np.where(bad, o, np.minimum(o, np.maximum(mml - p, 1)))
        rep["refused"] = int(bad.sum())
        rep["cut"] = int((~bad & (o2 < o)).sum())
    rep["text"] = over_long_line(rep)
    return Traffic(traffic.arrival_s, p2, o2, traffic.priority, refused), rep


def over_long_line(rep: dict) -> str:
    """The one line that says what happened to the requests longer than max_model_len."""
    if rep.get("max_model_len") is None:
        return rep.get("text") or "max_model_len not recorded: over-long requests not checked"
    head = f"{rep['over']:,} of {rep['requests']:,} requests longer than max_model_len {rep['max_model_len']:,}"
    if not rep["over"]:
        return head
    if rep["mode"] == "cut":
        return (f"{head}: cut as `tailtrace replay` sends them (output to max_model_len − 1, prompt to max_model_len − "
                "output; --over-long refuse: as vLLM answers them sent whole)")
    return (f"{head}: {rep['refused']:,} refused as vLLM answers them (HTTP 400: the prompt leaves no room), "
            f"{rep['cut']:,} served with the output clamped to max_model_len − prompt (--over-long cut: as replay sends them)")


def check_over_long(mode: str) -> str:
    """`--over-long` value checked; raises UserError naming the modes."""
    if mode not in OVER_LONG_MODES:
        raise UserError(f"--over-long {mode!r}: one of {', '.join(OVER_LONG_MODES)}")
    return mode
