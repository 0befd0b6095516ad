"""`tailtrace model tiny`: build a small Llama with random weights, offline and deterministically.

The model is a normal Hugging Face directory (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, generation_config.json) that vLLM loads like any other. Its weights are
noise: the model exists to exercise the serving stack with exact prompt/output lengths, not to
say anything. Two builds give byte-identical files (numpy's PCG64 with a fixed seed; the
tokenizer is trained on text kept in the repo, `embedded/corpus/`).

Shape: 2 layers, hidden 256, 4 heads of head_dim 64 (vLLM's CPU attention rejects head_dim 16),
intermediate 512, vocab 2048, max_position_embeddings 16384 (the Azure conversation trace's
longest prompt is 14,050 tokens plus at most 1,000 output tokens). Longer prompts are refused by
vLLM with HTTP 400; `tailtrace replay --max-input` clips them first.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tailtrace.plumbing.errors import UserError
from tailtrace.semantics import envs

__all__ = ["TINY", "build_tiny_model", "default_model_dir", "register"]

TINY = {
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 16384,
    "seed": 20231116,
}
_CORPUS_DIR = Path(__file__).parent / "corpus"


def default_model_dir() -> Path:
    """Where `tailtrace model tiny` writes by default: $TAILTRACE_HOME/models/tiny-llama
    (TAILTRACE_HOME defaults to ./.tailtrace)."""

    home = Path(envs.get("TAILTRACE_HOME"))
    return home / "models" / "tiny-llama"


def _train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    files = sorted(str(p) for p in _CORPUS_DIR.glob("*.txt"))
    if not files:
        raise UserError(f"no corpus text in {_CORPUS_DIR}; the tokenizer is trained on it")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    return tok


def build_tiny_model(out_dir: Path) -> Path:
    """Write the tiny Llama to `out_dir` (created if needed) and return it.

    Deterministic: the same tailtrace version writes byte-identical files. Raises `UserError`
    when `out_dir` exists and is not a directory.
    """
    import numpy as np
    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir} exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)

    tok = _train_tokenizer(TINY["vocab_size"])
    vocab = TINY["vocab_size"]
    bos_id = tok.token_to_id("<|begin_of_text|>")
    eos_id = tok.token_to_id("<|end_of_text|>")
    tok.save(str(out_dir / "tokenizer.json"))

    h, inter = TINY["hidden_size"], TINY["intermediate_size"]
    rng = np.random.Generator(np.random.PCG64(TINY["seed"]))

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": w(vocab, h)}
    for i in range(TINY["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            tensors[p + f"self_attn.{name}.weight"] = w(h, h)
        tensors[p + "mlp.gate_proj.weight"] = w(inter, h)
        tensors[p + "mlp.up_proj.weight"] = w(inter, h)
        tensors[p + "mlp.down_proj.weight"] = w(h, inter)
        tensors[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
    tensors["model.norm.weight"] = np.ones(h, dtype=np.float32)
    tensors["lm_head.weight"] = w(vocab, h)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": h,
        "intermediate_size": inter,
        "num_hidden_layers": TINY["num_hidden_layers"],
        "num_attention_heads": TINY["num_attention_heads"],
        "num_key_value_heads": TINY["num_key_value_heads"],
        "head_dim": h // TINY["num_attention_heads"],
        "max_position_embeddings": TINY["max_position_embeddings"],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
    }
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", {"bos_token_id": bos_id, "eos_token_id": eos_id})
    _write_json(
        out_dir / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|end_of_text|>",
            "model_max_length": TINY["max_position_embeddings"],
            "add_bos_token": False,
            "clean_up_tokenization_spaces": False,
        },
    )
    return out_dir


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def ensure_tiny_model(out_dir: Path | None = None) -> Path:
    """Return the tiny model's directory, building it first if it is missing."""
    out_dir = Path(out_dir) if out_dir else default_model_dir()
    if not (out_dir / "model.safetensors").exists() or not (out_dir / "config.json").exists():
        build_tiny_model(out_dir)
    return out_dir


def _cmd_model(args: argparse.Namespace) -> int:
    if args.out is not None and not args.out.strip():
        raise UserError("--out is empty: give a folder for the model, or leave --out out for the default")
    out = build_tiny_model(Path(args.out) if args.out else default_model_dir())
    print(out)
    return 0


def register(sub) -> None:
    """Register `tailtrace model tiny [--out DIR]`."""
    p = sub.add_parser("model", help="build a model locally (offline)")
    p.add_argument("kind", choices=["tiny"], help="tiny: 2-layer Llama, random weights, local BPE tokenizer")
    p.add_argument("--out", help="output directory (default: .tailtrace/models/tiny-llama)")
    p.set_defaults(func=_cmd_model)
