"""Device metrics: a sampler of GPU (NVML) or CPU (psutil) counters exported as OTLP metrics.

Imports are lazy so that `tailtrace`'s command registration stays cheap.
"""

__all__ = ["DeviceSample", "DeviceSampler", "decode_throttle_reasons"]


def __getattr__(name):
    if name == "DeviceSampler":
        from tailtrace.instrument.device.sampler import DeviceSampler

        return DeviceSampler
    if name == "DeviceSample":
        from tailtrace.instrument.device.backends import DeviceSample

        return DeviceSample
    if name == "decode_throttle_reasons":
        from tailtrace.semantics.throttle import decode_throttle_reasons

        return decode_throttle_reasons
    raise AttributeError(name)
