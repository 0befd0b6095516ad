"""Pure tests of the gateway's routing, admission and input limits (no sockets)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from tailtrace.instrument.gateway.admission import AdmissionController, QueueFull, UpstreamPool
from tailtrace.instrument.gateway.config import BATCH, INTERACTIVE, SETTINGS, GatewayConfig
from tailtrace.instrument.gateway.limits import LimitError, TokenCounter, check_input
from tailtrace.plumbing.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def _controller(n_up=1, conc=1, qi=4, qb=4):
    pool = UpstreamPool([f"http://u{i}" for i in range(n_up)], conc)
    return pool, AdmissionController(pool, {INTERACTIVE: qi, BATCH: qb})


def test_least_outstanding_and_health():
    pool = UpstreamPool(["http://a", "http://b", "http://c"], 10)
    a, b, c = pool.upstreams
    a.outstanding, b.outstanding, c.outstanding = 3, 1, 2
    assert pool.pick() is b
    pool.mark(b, False, "down")
    assert pool.pick() is c
    pool.mark(b, True)
    assert pool.pick() is b
    # every upstream out: panic mode considers them all rather than black-holing traffic
    for u in pool.upstreams:
        pool.mark(u, False, "down")
    assert pool.pick() is b
    assert pool.pick(exclude=[b]) is c


def test_full_upstreams_queue_and_interactive_goes_first():
    async def main():
        pool, adm = _controller(conc=1)
        first = await adm.acquire(BATCH)
        order = []

        async def req(name, prio):
            up = await adm.acquire(prio)
            order.append(name)
            adm.release(up, 0.01)

        tasks = [asyncio.create_task(req("b1", BATCH)), asyncio.create_task(req("b2", BATCH))]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(req("i1", INTERACTIVE)))
        await asyncio.sleep(0)
        assert adm.depth(BATCH) == 2 and adm.depth(INTERACTIVE) == 1
        # a new arrival does not overtake the queue even if a slot is free at that instant
        assert adm.try_acquire(BATCH) is None
        adm.release(first, 0.5)
        await asyncio.gather(*tasks)
        assert order == ["i1", "b1", "b2"]
        assert pool.upstreams[0].outstanding == 0

    asyncio.run(main())


def test_queue_full_and_retry_after():
    async def main():
        _, adm = _controller(conc=1, qb=1)
        held = await adm.acquire(INTERACTIVE)
        waiter = asyncio.create_task(adm.acquire(BATCH))
        await asyncio.sleep(0)
        with pytest.raises(QueueFull) as ei:
            await adm.acquire(BATCH)
        assert ei.value.retry_after_s >= 1 and ei.value.limit == 1
        # the interactive queue is separate and still has room
        other = asyncio.create_task(adm.acquire(INTERACTIVE))
        await asyncio.sleep(0)
        assert adm.depth(INTERACTIVE) == 1
        adm.release(held)
        assert (await other).outstanding == 1
        waiter.cancel()

    asyncio.run(main())


def test_cancelled_waiter_leaves_queue_and_slot_is_not_lost():
    async def main():
        pool, adm = _controller(conc=1)
        held = await adm.acquire(INTERACTIVE)
        w = asyncio.create_task(adm.acquire(INTERACTIVE))
        await asyncio.sleep(0)
        w.cancel()
        await asyncio.sleep(0)
        assert adm.depth() == 0
        adm.release(held)
        assert pool.upstreams[0].outstanding == 0
        assert adm.try_acquire(BATCH) is pool.upstreams[0]

    asyncio.run(main())


def test_token_counts_and_limits():
    counter = TokenCounter()
    assert check_input({"prompt": list(range(3, 103))}, "completions", counter, 100, "off").input_tokens == 100
    with pytest.raises(LimitError) as ei:
        check_input({"prompt": list(range(3, 104))}, "completions", counter, 100, "off")
    assert ei.value.status == 400 and ei.value.code == "context_length_exceeded" and "101 tokens" in ei.value.message
    # text: bytes/4, rounded up
    assert check_input({"prompt": "x" * 401}, "completions", counter, 1000, "off").input_tokens == 101
    chat = {"messages": [{"role": "user", "content": "a" * 40}, {"role": "user", "content": [
        {"type": "text", "text": "b" * 80}, {"type": "image_url", "image_url": {"url": "x"}}]}]}
    assert check_input(chat, "chat", counter, 1000, "off").input_tokens == 30
    with pytest.raises(LimitError) as ei:
        check_input({"prompt": {"x": 1}}, "completions", counter, 10, "off")
    assert ei.value.code == "invalid_prompt"


def test_truncate_middle_keeps_head_and_tail():
    counter = TokenCounter()
    body = {"prompt": list(range(1000, 1101))}  # 101 tokens
    res = check_input(body, "completions", counter, 10, "middle")
    assert body["prompt"] == [1000, 1001, 1002, 1003, 1004, 1096, 1097, 1098, 1099, 1100]
    assert res.changed and res.truncated_tokens == 91 and res.input_tokens == 10
    body = {"prompt": ["h" * 40 + "m" * 400 + "t" * 40, [5, 6, 7]]}
    res = check_input(body, "completions", counter, 20, "middle")
    assert body["prompt"][0] == "h" * 40 + "t" * 40 and body["prompt"][1] == [5, 6, 7]
    assert res.truncated_tokens == 100
    chat = {"messages": [{"role": "system", "content": "s" * 40}, {"role": "user", "content": "u" * 400}]}
    res = check_input(chat, "chat", counter, 50, "middle")
    assert chat["messages"][0]["content"] == "s" * 40  # the short message is untouched
    assert counter.count(chat["messages"][1]["content"]) == 40 and res.input_tokens == 50


def test_truncate_with_a_real_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["The quick brown fox jumps over the lazy dog."] * 20,
                            trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))
    counter = TokenCounter(str(tmp_path))
    assert counter.exact
    text = "The quick brown fox jumps over the lazy dog. " * 50
    n = counter.count(text)
    body = {"prompt": text}
    res = check_input(body, "completions", counter, 40, "middle")
    assert counter.count(body["prompt"]) <= 40 and res.truncated_tokens >= n - 40
    assert body["prompt"].startswith("The quick") and body["prompt"].endswith("lazy dog. ")
    with pytest.raises(UserError):
        TokenCounter(str(tmp_path / "missing"))


def test_config_validation_errors():
    with pytest.raises(UserError, match="no upstream"):
        GatewayConfig().validate()
    with pytest.raises(UserError, match="not an http"):
        GatewayConfig(upstreams=("localhost:8000",)).validate()
    with pytest.raises(UserError, match="--truncate"):
        GatewayConfig(upstreams=("http://a",), truncate="left").validate()
    with pytest.raises(UserError, match="--max-concurrency"):
        GatewayConfig(upstreams=("http://a",), max_concurrency=0).validate()
    cfg = GatewayConfig(upstreams=("http://a:1/v1/", "http://b:2")).validate()
    assert cfg.upstreams == ("http://a:1", "http://b:2")


def test_every_setting_is_documented():
    doc = (ROOT / "docs" / "gateway.md").read_text()
    for s in SETTINGS:
        assert re.search(re.escape(s.flag) + r"(?![\w-])", doc), f"{s.flag} missing from docs/gateway.md"
        assert s.env in doc, f"{s.env} missing from docs/gateway.md"


def test_cli_bad_flags_exit_2(capsys):
    from tailtrace.cli import main

    assert main(["gateway", "--upstream", "ftp://x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--upstream" in err


def test_output_cap_lowers_or_sets_max_tokens_and_leaves_smaller_ones():
    from tailtrace.instrument.gateway.limits import cap_output

    body = {"prompt": "x", "max_tokens": 500}
    assert cap_output(body, 64) and body["max_tokens"] == 64
    body = {"prompt": "x", "max_tokens": 10}
    assert not cap_output(body, 64) and body["max_tokens"] == 10
    body = {"messages": [], "max_completion_tokens": 900}
    assert cap_output(body, 64) and body == {"messages": [], "max_completion_tokens": 64}
    body = {"prompt": "x"}  # no limit asked: the engine would run to the model's length
    assert cap_output(body, 64) and body["max_tokens"] == 64
    body = {"prompt": "x", "max_tokens": "lots"}  # not ours to judge: vLLM answers 400
    assert not cap_output(body, 64) and body["max_tokens"] == "lots"
    assert not cap_output({"prompt": "x", "max_tokens": 500}, None)
    with pytest.raises(UserError, match="--max-output-tokens"):
        GatewayConfig(upstreams=("http://a",), max_output_tokens=0).validate()


def test_priority_classes_off_is_one_fifo_order():
    on = GatewayConfig(upstreams=("http://a",)).validate()
    off = GatewayConfig(upstreams=("http://a",), priority_classes="off").validate()
    assert on.queue_class(BATCH) == BATCH and off.queue_class(BATCH) == INTERACTIVE
    with pytest.raises(UserError, match="--priority-classes"):
        GatewayConfig(upstreams=("http://a",), priority_classes="maybe").validate()

    async def main(cfg):
        # one slot, held; then b1, b2 (batch) and i1 (interactive) wait for it, in that order
        _, adm = _controller(conc=1)
        held = await adm.acquire(cfg.queue_class(BATCH))
        waiting = {}
        for name, prio in (("b1", BATCH), ("b2", BATCH), ("i1", INTERACTIVE)):
            waiting[name] = asyncio.ensure_future(adm.acquire(cfg.queue_class(prio)))
            await asyncio.sleep(0)
        served = []
        up = held
        while waiting:
            adm.release(up, 0.01)
            await asyncio.sleep(0)
            name = next(n for n, fut in waiting.items() if fut.done())
            served.append(name)
            up = waiting.pop(name).result()
        return served

    assert asyncio.run(main(on)) == ["i1", "b1", "b2"]
    assert asyncio.run(main(off)) == ["b1", "b2", "i1"]


def test_each_number_has_one_range_for_flag_env_and_config(monkeypatch, capsys):
    """A number's range is the Setting's (config.SETTINGS): the flag, the env var and a config built
    in code are refused by the same range, and the env var's refusal names the env var."""
    from tailtrace.cli import main

    numbers = [s for s in SETTINGS if s.type in (int, float)]
    assert numbers and all(s.range is not None for s in numbers), [s.name for s in numbers if s.range is None]
    margin = next(s for s in SETTINGS if s.name == "ladder_margin")
    with pytest.raises(SystemExit) as exited:  # argparse's one line; the flag took up to 10 before
        main(["gateway", "--upstream", "http://a", "--ladder-margin", "2"])
    assert exited.value.code == 2
    assert "--ladder-margin" in capsys.readouterr().err
    with pytest.raises(UserError, match=r"--ladder-margin 2 is out of range: more than 0, at most 1"):
        GatewayConfig(upstreams=("http://a",), ladder_margin=2).validate()
    monkeypatch.setenv("TAILTRACE_GATEWAY_PORT", "0")
    args = type("Args", (), {})()
    with pytest.raises(UserError, match=r"TAILTRACE_GATEWAY_PORT='0': '0' is out of range: at least 1"):
        GatewayConfig.from_args(args)
    assert margin.parse("0.5") == 0.5
