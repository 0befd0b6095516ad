"""`tailtrace sample`: run the device sampler standalone until Ctrl-C / SIGTERM (or --duration)."""

from __future__ import annotations

import argparse

from tailtrace.plumbing.argtypes import bounded_float, seconds

__all__ = ["register"]


def register(sub) -> None:
    """Add the `sample` sub-command to `sub` (argparse sub-parsers)."""
    p = sub.add_parser(
        "sample",
        help="sample GPU (NVML) or CPU counters every 100 ms and send them to the collector",
        description=(
            "Sample every GPU through NVML (utilisation, memory-bandwidth utilisation, memory, SM and "
            "memory clocks, power, temperature, clock-event/throttle reasons) or, without NVML, every "
            "CPU core (psutil; source='cpu'), and export them as OTLP metrics to the collector, which "
            "stores them in device_samples."
        ),
    )
    p.add_argument("--interval", type=bounded_float(0.01, 60.0), default=0.1, help="sampling period in seconds (default 0.1)")
    p.add_argument("--export-interval", type=bounded_float(0.01, 600.0), default=1.0, help="export period in seconds (default 1.0)")
    p.add_argument(
        "--otlp-endpoint", default=None,
        help="collector OTLP/HTTP base URL (default: $TAILTRACE_OTLP_ENDPOINT, $OTEL_EXPORTER_OTLP_ENDPOINT, "
        "http://127.0.0.1:4318)",
    )
    p.add_argument("--source", choices=("auto", "nvml", "cpu"), default="auto",
                   help="auto: NVML when a GPU is visible, else the CPU (default auto)")
    p.add_argument("--duration", type=seconds(31_536_000), default=None, help="stop after this many seconds (default: run until Ctrl-C)")
    p.add_argument("--print", dest="print_samples", action="store_true", help="also print each sweep on stdout")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import logging
    import signal
    import threading

    from tailtrace.instrument.device.sampler import DeviceSampler
    from tailtrace.plumbing.errors import UserError

    if args.duration is not None and args.duration <= 0:
        raise UserError(f"--duration must be > 0 seconds, got {args.duration}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sampler = DeviceSampler(args.interval, args.otlp_endpoint, export_interval_s=args.export_interval, source=args.source)
    done = threading.Event()
    prev = signal.signal(signal.SIGTERM, lambda *_: done.set())
    sampler.start()
    print(f"sampling {sampler.source} every {sampler.interval_s} s -> {sampler.endpoint}/v1/metrics", flush=True)
    try:
        if args.print_samples:
            _print_loop(sampler, done, args.duration)
        else:
            done.wait(args.duration)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, prev)
        sampler.stop()
    st = sampler.stats
    print(
        f"samples={st.samples} exported={st.exported} dropped={st.dropped} "
        f"missed_ticks={st.missed_ticks} export_failures={st.export_failures}",
        flush=True,
    )
    return 0


def _print_loop(sampler, done, duration) -> None:
    import time

    end = None if duration is None else time.monotonic() + duration
    seen = 0
    while not done.wait(max(sampler.interval_s, 0.5)):
        if end is not None and time.monotonic() >= end:
            break
        if sampler.stats.sweeps != seen:
            seen = sampler.stats.sweeps
            for s in sampler.last_sweep:
                print(
                    f"{s.source} {s.device_index} util={s.util_pct} mem_util={s.mem_util_pct} "
                    f"clock={s.sm_clock_mhz} power={s.power_w} temp={s.temp_c} throttle={s.throttle_reasons!r}",
                    flush=True,
                )
