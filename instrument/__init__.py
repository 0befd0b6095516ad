"""Code that runs inside serving processes and emits OTLP: the vLLM plugin, the gateway and the
device sampler. Importing this package (or any module but `instrument.vllm_plugin`) never
imports vLLM.
"""

__all__: list[str] = []
