"""The step-time fit recovers known coefficients from synthetic steps; the model file refuses
another version; the CLI's bad input is one line and exit 2; a simulated run written as a store
reads back as a measured one (compare and explain take it)."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pytest

from tailtrace.cli import main
from tailtrace.collector.query.reader import db_query
from tailtrace.simulate.fit import fit_model, nnls_exact
from tailtrace.simulate.model import StepModel, load_model

TRUE = [1.5, 0.2, 0.05, 0.4, 30.0]  # a0, per seq, per token, per 1e3 decode context, per 1e6 prefill attention


def test_nnls_exact_finds_the_non_negative_optimum():
    rng = np.random.default_rng(1)
    X = rng.uniform(0, 1, (200, 3))
    y = X @ np.array([2.0, 0.0, 1.0]) - 0.3 * X[:, 1]  # the unconstrained fit wants a negative middle term
    b = nnls_exact(X, y)
    assert b[1] == 0 and b[0] > 0 and b[2] > 0
    assert np.all(nnls_exact(X, X @ np.array([1.0, 2.0, 3.0])) == pytest.approx([1.0, 2.0, 3.0]))


def _synthetic_store(path, n_req=400, seed=3):
    """Requests arrive one per step in bursts; each step decodes every running request and prefills
    the new one whole. Step cycle = TRUE law x (1 + 1% noise). Writes engine_steps, decode_steps,
    requests, spans as the store's columns the fit reads."""
    rng = np.random.default_rng(seed)
    t_us = 1_800_000_000 * 10**6
    running: list[list] = []  # [rid, prompt, tokens so far, output]
    steps, dec_rows, reqs = [], [], []
    i = 0
    k = 0
    while i < n_req or running:
        new = None
        if i < n_req and (rng.random() < 0.3 or not running):
            new = [f"r{i}", int(rng.integers(20, 800)), 0, int(rng.integers(5, 120))]
            i += 1
        ctx = sum(p + g for _, p, g, _ in running)
        n = len(running) + (new is not None)
        pre = new[1] if new else 0
        tokens = len(running) + pre
        attn = pre * pre / 2
        cycle = TRUE[0] + TRUE[1] * n + TRUE[2] * tokens + TRUE[3] * ctx / 1e3 + TRUE[4] * attn / 1e6
        cycle *= 1 + rng.normal(0, 0.01)
        t_us += int(cycle * 1000)
        ts = f"make_timestamp({t_us})"
        for r in running:
            r[2] += 1
            dec_rows.append((r[0], r[2] - 1, ts))
        if new:
            new[2] = 1
            dec_rows.append((new[0], 0, ts))
            reqs.append((new[0], new[1], new[3], 1.0))
            running.append(new)
        waiting = int(i < n_req)
        finished = [r for r in running if r[2] >= r[3]]
        running = [r for r in running if r[2] < r[3]]
        steps.append((ts, k, len(running), waiting, n, pre, n - (new is not None), cycle * 0.9))
        k += 1
        del finished
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE engine_steps(time TIMESTAMP, service_name VARCHAR, step_index BIGINT, running BIGINT, "
                "waiting BIGINT, batch_size BIGINT, prefill_tokens BIGINT, decode_tokens BIGINT, step_ms DOUBLE)")
    con.execute("CREATE TABLE decode_steps(trace_id VARCHAR, request_id VARCHAR, token_index INTEGER, time TIMESTAMP)")
    con.execute("CREATE TABLE requests(trace_id VARCHAR, request_id VARCHAR, prompt_tokens BIGINT, cached_tokens BIGINT,"
                " output_tokens BIGINT, prefill_ms DOUBLE, model VARCHAR, ok BOOLEAN, queue_ms DOUBLE, decode_ms DOUBLE,"
                " outer_ttft_ms DOUBLE, outer_e2e_ms DOUBLE, gateway_queue_ms DOUBLE, arrival_time TIMESTAMP,"
                " run_id VARCHAR, completion_time TIMESTAMP, network_in_ms DOUBLE, network_out_ms DOUBLE)")
    con.execute("CREATE TABLE spans(phase VARCHAR, start_time TIMESTAMP, resource JSON, service_name VARCHAR)")
    import pyarrow as pa

    us = lambda ts: int(ts[15:-1])
    es = pa.table({"t": [us(x[0]) for x in steps], **{c: [x[i] for x in steps] for i, c in enumerate(
        ("k", "run", "wait", "n", "pre", "dec", "ms"), start=1)}})
    ds = pa.table({"rid": [x[0] for x in dec_rows], "ti": [x[1] for x in dec_rows], "t": [us(x[2]) for x in dec_rows]})
    con.register("es", es)
    con.register("ds", ds)
    con.execute("INSERT INTO engine_steps SELECT make_timestamp(t), 'vllm', k, run, wait, n, pre, dec, ms FROM es")
    con.execute("INSERT INTO decode_steps SELECT rid, rid, ti, make_timestamp(t) FROM ds")
    # one arrival a second, each completing 2.5 s later: from the third on, 3 requests in flight at arrival
    con.executemany("INSERT INTO requests VALUES (?, ?, ?, 0, ?, ?, 'm', TRUE, 1.0, 50.0, 80.0, 140.0, 0.0, "
                    "make_timestamp(?), NULL, make_timestamp(?), NULL, NULL)",
                    [(rid, rid, p, o, pm, 1_800_000_000_000_000 + k * 10**6, 1_800_000_002_500_000 + k * 10**6)
                     for k, (rid, p, o, pm) in enumerate(reqs)])
    con.close()


def test_the_fit_recovers_known_coefficients_from_synthetic_steps(tmp_path):
    path = tmp_path / "s.duckdb"
    _synthetic_store(path)
    q, close = db_query(path)
    try:
        m = fit_model(q, store=str(path))
    finally:
        close()
    assert m.coef_ms == pytest.approx(TRUE, rel=0.1, abs=0.02)
    ho = m.fit["held_out"]
    assert ho["median_err_decode"] < 0.02 and ho["median_err_mixed"] < 0.02 and ho["window_sum_err"] < 0.02
    assert m.fit["met"] == {"median_err_decode": True, "median_err_mixed": True, "window_sum_err": True}
    assert 0.95 < np.median(m.residuals["decode"]) < 1.05
    assert m.identity["service"] == "vllm" and m.identity["model"] == "m"
    assert m.overheads and m.overheads[0][:2] == [80.0 - 1.0 - 1.0, 140.0 - 80.0 - 50.0]  # pre, post (ms)
    in_flight = sorted(o[2] for o in m.overheads)  # requests in flight at its arrival, itself included
    assert in_flight[:2] == [1, 2] and set(in_flight[2:]) == {3}


def test_the_time_outside_the_engine_is_drawn_at_the_load_it_was_measured_at():
    m = StepModel([1, 0, 0, 0, 0], {"decode": [1.0]}, [[10.0, 1.0, 1], [500.0, 2.0, 16], [520.0, 2.0, 20]], {}, {})
    assert m.overhead(1) == (10.0, 1.0)
    assert {m.overhead(18)[0] for _ in range(50)} == {500.0, 520.0}  # 16..31 in flight: one bucket
    assert m.overhead(3) == (10.0, 1.0)  # no sample at 2..3: the nearest bucket measured (1)
    assert m.overhead(1000)[0] in (500.0, 520.0)


def test_a_model_file_of_another_version_or_shape_is_refused(tmp_path):
    from tailtrace.plumbing.errors import UserError

    p = tmp_path / "m.json"
    p.write_text(json.dumps({"schema": "tailtrace.simulate-model/0"}))
    with pytest.raises(UserError, match="simulate-model/0 model; this tailtrace reads tailtrace.simulate-model/1"):
        load_model(p)
    p.write_text("{}")
    with pytest.raises(UserError, match="not a tailtrace simulate model"):
        load_model(p)
    with pytest.raises(UserError, match="no model file"):
        load_model(tmp_path / "none.json")


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("m")
    _synthetic_store(d / "s.duckdb")
    assert main(["simulate", "fit", "--db", str(d / "s.duckdb"), "--out", str(d / "model.json")]) == 0
    return d / "model.json"


def _trace(path, rows):
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for t, n_in, n_out in rows:
        lines.append(f"2024-01-01 00:00:{t:09.6f},{n_in},{n_out}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("extra, msg", [
    (["--set", "tensor_parallel_size=2"], "the simulator does not model it; it models max_num_seqs"),
    (["--set", "max_num_seqs"], "use knob=value"),
    (["--set", "max_num_seqs=lots"], "not a valid value"),
    (["--set", "max_num_batched_tokens=8"], "must be >= max_num_seqs"),
    (["--slo", "ttft_p99=fast"], "bad --slo item"),
    (["--replicas", "100000"], "argument --replicas: '100000' is out of range: at least 1, at most 1024"),
    (["--rate-x", "0"], "argument --rate-x: '0' is out of range: more than 0, at most 1000"),
    (["--set", "kv_cache_blocks=0"], "kv_cache_blocks must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_2(model_file, tmp_path, capsys, extra, msg):
    tr = _trace(tmp_path / "t.csv", [(0.1 * i, 100, 10) for i in range(20)])
    try:
        rc = main(["simulate", "run", "--model", str(model_file), "--traffic", tr, *extra])
    except SystemExit as exc:  # argparse's own refusal of a flag's value
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("edit", [{"residuals": None}, {"residuals": {"decode": ["x"]}}, {"overheads": "x"},
                                  {"overheads": [[1.0]]}, {"deployment": None}, {"identity": []}, {"fit": 3}])
def test_a_model_file_edited_out_of_shape_is_one_line(model_file, tmp_path, capsys, edit):
    """A hand-edited model whose parts have the wrong shapes: refused with the fields a model needs
    (residuals null or overheads "x" were tracebacks)."""
    import json

    doc = json.loads(model_file.read_text())
    doc.update(edit)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    tr = _trace(tmp_path / "t.csv", [(0.1 * i, 100, 10) for i in range(20)])
    assert main(["simulate", "run", "--model", str(bad), "--traffic", tr]) == 2
    err = capsys.readouterr().err.strip()
    assert "a model file needs" in err and len(err.splitlines()) == 1, err


def test_traffic_from_another_deployment_is_refused_naming_the_mismatch(model_file, tmp_path, capsys):
    other = tmp_path / "o.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE engine_steps(time TIMESTAMP, service_name VARCHAR)")
    con.execute("INSERT INTO engine_steps VALUES (now(), 'vllm-big')")
    con.execute("CREATE TABLE requests(model VARCHAR, run_id VARCHAR)")
    con.execute("INSERT INTO requests VALUES ('llama-70b', 'r1')")
    con.execute("CREATE TABLE spans(phase VARCHAR, start_time TIMESTAMP, resource JSON, service_name VARCHAR)")
    con.close()
    assert main(["simulate", "run", "--model", str(model_file), "--traffic", f"store:{other}#r1"]) == 2
    err = capsys.readouterr().err
    assert "engine service 'vllm'" in err and "'vllm-big'" in err and "'llama-70b'" in err


def test_run_and_capacity_answer_and_a_simulated_store_reads_as_a_measured_run(model_file, tmp_path, capsys):
    tr = _trace(tmp_path / "t.csv", [(0.05 * i, 100 + 7 * i, 10 + i % 13) for i in range(200)])
    out = tmp_path / "sim.duckdb"
    assert main(["simulate", "run", "--model", str(model_file), "--traffic", tr, "--set", "max_num_seqs=2",
                 "--format", "json", "--store-out", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    a, b = doc["arms"]["A"], doc["arms"]["B"]
    assert a["requests"] == b["requests"] == 200 and a["rejected"] == 0
    # two seats instead of the recorded 256 (vLLM's default): requests wait, TTFT grows
    assert b["metrics"]["ttft"]["P99"] > 1.2 * a["metrics"]["ttft"]["P99"]
    assert doc["ratios"]["ttft"]["P99"] == pytest.approx(b["metrics"]["ttft"]["P99"] / a["metrics"]["ttft"]["P99"])
    runs = doc["store"]["runs"]
    # the store reads as a measured run: compare finds B's TTFT worse, on the same numbers
    from tailtrace.experiment.compare import compare

    q, close = db_query(out)
    try:
        rows = q("SELECT run_id, count(*), quantile_cont(outer_ttft_ms, 0.99), count(queue_ms), "
                 "max(abs(unattributed_ms)) FROM requests GROUP BY 1 ORDER BY 1", [])
        kinds = q("SELECT json_extract_string(attributes, '$.\"tailtrace.run.kind\"') FROM spans WHERE phase = 'run'", [])
        c = compare(q, [runs[0]], [runs[1]], split=2)
    finally:
        close()
    assert [r[0] for r in rows] == runs and all(r[1] == 200 and r[3] == 200 for r in rows)
    assert rows[0][2] == pytest.approx(a["metrics"]["ttft"]["P99"], rel=1e-6)
    assert rows[1][2] == pytest.approx(b["metrics"]["ttft"]["P99"], rel=1e-6)
    assert all(r[4] < 1.0 for r in rows)  # every phase measured: nothing left unattributed
    assert {k[0] for k in kinds} == {"simulation"}
    assert c.row("ttft", 0.5).b_ms > c.row("ttft", 0.5).a_ms
    # goodput: one definition (semantics.slo.goodput_sql), the same share from the simulator and the store
    arms = c.to_dict()["arms"]
    assert 0 < a["goodput_share"] < 1 and 0 < b["goodput_share"] < 1
    assert arms["A"]["goodput_share"] == pytest.approx(a["goodput_share"])
    assert arms["B"]["goodput_share"] == pytest.approx(b["goodput_share"])
    assert main(["explain", "--db", str(out), "--run-id", runs[1], "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["scope"]["run_id"] == runs[1] and rep["scope"]["runs"]["kind"] == "simulation"
    assert main(["simulate", "capacity", "--model", str(model_file), "--traffic", tr, "--replicas", "1,2",
                 "--slo", "ttft_p99=500ms", "--min-requests", "400", "--format", "json"]) == 0
    cap = json.loads(capsys.readouterr().out)
    r1, r2 = cap["capacity"]
    assert r1["rate_x"] and r2["rate_x"] and r2["rate_rps"] > 1.5 * r1["rate_rps"]
    assert r1["summary"]["objectives"][0]["met"]


def test_a_store_out_that_is_not_a_store_is_refused_before_simulating_and_kept(model_file, tmp_path, capsys):
    tr = _trace(tmp_path / "t.csv", [(0.1 * i, 100, 10) for i in range(20)])
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    assert main(["simulate", "run", "--model", str(model_file), "--traffic", tr, "--store-out", str(notes)]) == 2
    cap = capsys.readouterr()
    assert "--store-out" in cap.err and "not a valid DuckDB database" in cap.err and not cap.out
    assert notes.read_text() == "my notes\n"


def test_the_wait_for_the_step_in_progress_is_not_counted_as_time_outside_the_engine():
    """vLLM's engine core takes a request between steps: one that came in during a 700 ms prefill step
    waited for it in the frontend phase; the simulator has it wait for that step in its queue, so the
    fit takes it out of the drawn time outside the engine (counted twice before: issue 33's bench)."""
    from tailtrace.simulate.fit import _step_wait_ms

    steps = {"t_us": np.array([1_000_000.0, 1_700_000.0, 1_704_000.0]),
             "cycle_ms": np.array([np.nan, 700.0, 4.0]), "step_ms": np.array([3.0, 690.0, 3.5])}
    # reached the API server 2 ms after arriving at 1.2 s; the scheduler took it 0.5 ms after the step's end
    assert _step_wait_ms(steps, 1_200_000, 2.0, 500.5) == pytest.approx(498.0)
    # arrived before the step began: it waited for all of it (the cycle from the step before's end)
    assert _step_wait_ms(steps, 900_000, 2.0, 800.0) == pytest.approx(700.0)
    # taken 30 ms after any step ended (an idle engine): no wait to take out
    assert _step_wait_ms(steps, 1_800_000, 2.0, 30.0) == 0.0
    # after an idle engine, the step's own time is its length (no cycle): 3 ms before 1.0 s
    assert _step_wait_ms(steps, 990_000, 0.0, 10.0) == pytest.approx(3.0)
    assert _step_wait_ms(None, 1_200_000, 2.0, 500.5) == 0.0


def test_refused_requests_are_misses_and_capacity_refuses_what_it_does_not_simulate(model_file, tmp_path, capsys):
    """One queued request allowed (max_num_queued_reqs=1) under a burst: most are refused with 503, and
    the few answered fast must not read as "met"; capacity at an ITL objective (not simulated) is refused,
    not "misses at any rate"."""
    tr = _trace(tmp_path / "t.csv", [(0.001 * i, 400, 50) for i in range(60)])
    assert main(["simulate", "run", "--model", str(model_file), "--traffic", tr, "--set", "max_num_queued_reqs=1",
                 "--set", "max_num_seqs=1", "--slo", "ttft_p99=60s", "--format", "json"]) == 0
    b = json.loads(capsys.readouterr().out)["arms"]["B"]
    (o,) = b["objectives"]
    assert b["rejected"] > 30 and o["value_ms"] < 60_000  # the answered few were fast enough
    assert o["met"] is False and o["why"] == f"{b['rejected']:,} of 60 requests refused"
    assert main(["simulate", "capacity", "--model", str(model_file), "--traffic", tr,
                 "--slo", "ttft_p99=2s,itl_p99=50ms"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "itl_p99<=50ms: not simulated" in err, err


def test_a_simulation_written_into_a_measured_store_never_becomes_its_default_scope(model_file, tmp_path, capsys):
    """`simulate run --store-out` into a store of measured traffic adds a run of kind simulation; explain's
    default scope (the latest traffic run) stays the measured one (it took the prediction, later)."""
    import numpy as np

    from tailtrace.collector.query.runs import Run, latest_traffic_run
    from tests.diagnose.store import baseline, write_store

    reqs = baseline(np.random.default_rng(3), n=200)
    for r in reqs:
        r.run_id = "replay-measured"
    store = write_store(tmp_path / "m.duckdb", reqs)
    tr = _trace(tmp_path / "t.csv", [(0.05 * i, 100, 10) for i in range(60)])
    assert main(["simulate", "run", "--model", str(model_file), "--traffic", tr, "--store-out", store]) == 0
    capsys.readouterr()
    assert main(["explain", "--db", store, "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["scope"]["runs"]["run_id"] == "replay-measured", rep["scope"]
    # the rule itself: measured named runs first, then live traffic of no run, a simulation only alone
    sim, meas, live = (Run("sim-1-A", "simulation", 5, "t1", "t9", None), Run("r", "replay", 5, "t0", "t1", None),
                       Run(None, None, 5, "t0", "t2", None))
    assert latest_traffic_run([meas, sim]) is meas
    assert latest_traffic_run([live, sim]) is None  # explain scopes the live traffic
    assert latest_traffic_run([sim]) is sim
