"""chaos.cpu_contention.find_window on its own (pure: no process, no store): the window of
elevated step time in a sequence of engine steps, found from the step times alone."""

from __future__ import annotations

import random

from tailtrace.chaos.cpu_contention import find_window

MS = 1_000_000  # ns


def _steps(n: int, period_ms: float, level, seed: int = 0):
    """n steps `period_ms` apart (their ends, ns) with step times level(t_ms) + noise."""
    rng = random.Random(seed)
    ends = [int(1e18) + int(i * period_ms * MS) for i in range(n)]
    return ends, [level(i * period_ms) * rng.uniform(0.9, 1.1) for i in range(n)]


def test_a_level_shift_is_found_to_within_a_step_at_both_ends():
    # 5 ms steps, 12 ms from 10 s to 20 s; a tenth of the outside steps are wild (host noise)
    ends, ms = _steps(3000, 10.0, lambda t: 12.0 if 10_000 <= t < 20_000 else 5.0)
    for k in range(5, 3000, 10):
        if not 1000 <= k < 2000:
            ms[k] = 30.0
    found = find_window(ends, ms)
    assert abs((found.start_unix_ns - ends[1000]) / MS) <= 15 and abs((found.end_unix_ns - ends[1999]) / MS) <= 15
    assert 5.5 < found.threshold_ms < 11.5 and found.steps == 1000 and found.total == 3000


def test_idle_gaps_and_order_do_not_matter():
    # steps only in bursts (the engine idle between requests), given out of order
    ends, ms = _steps(3000, 10.0, lambda t: 9.0 if 12_000 <= t < 18_000 else 4.0, seed=1)
    keep = [i for i in range(3000) if (i // 20) % 3 != 0]
    pairs = [(ends[i], ms[i]) for i in keep][::-1]
    found = find_window([p[0] for p in pairs], [p[1] for p in pairs])
    first_in = min(ends[i] for i in keep if i >= 1200)
    last_in = max(ends[i] for i in keep if i < 1800)
    assert abs(found.start_unix_ns - first_in) / MS <= 15 and abs(found.end_unix_ns - last_in) / MS <= 15


def test_too_few_steps_is_none():
    assert find_window([1, 2], [5.0, 6.0]) is None
    assert find_window([1, 2, 3], [5.0, None, 6.0]) is None


def test_a_host_whose_load_moved_outside_the_window_does_not_stretch_it():
    # CI's failed run (its engine_steps' medians): 1196 steps at 4.55 ms before the hog, 556 at 15.6 ms
    # inside its 10 s, 1367 at 5.12 ms after it (the shared box a little busier). From the median alone
    # the threshold settled at 5.04 ms, between the two outside levels, and the window ran 10.2 s past
    # the hog's end over the 5.12 ms steps
    rng = random.Random(2)
    ms = ([4.55 * rng.uniform(0.85, 1.15) for _ in range(1196)] + [15.6 * rng.uniform(0.6, 1.4) for _ in range(556)]
          + [5.12 * rng.uniform(0.85, 1.15) for _ in range(1367)])
    ends, t = [], int(1e18)
    for v in ms:
        t += int((v + 2.0) * MS)
        ends.append(t)
    found = find_window(ends, ms)
    assert abs(found.start_unix_ns - (ends[1196] - int(ms[1196] * MS))) / MS <= 40, found
    assert abs(found.end_unix_ns - ends[1751]) / MS <= 40, found
    assert 7.0 < found.threshold_ms < 13.0 and abs(found.steps - 556) <= 3, found
