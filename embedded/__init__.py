"""embedded: the embedded deployment, brought up on one host without GPU, Docker or network.

- `embedded.model`: the tiny Llama built offline and deterministically (its tokenizer trained on `corpus/`);
- `embedded.serve`: `tailtrace serve`, the real vLLM (CPU build) with the plugin, bound to cores;
- `embedded.stack`: the collector, vLLM and the gateway together (demo, chaos, `try`).

Below the parts that use it (chaos, experiment, `tailtrace demo`); it imports plumbing, semantics,
instrument and collector only.
"""
