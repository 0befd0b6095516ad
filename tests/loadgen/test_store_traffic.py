"""Traffic from a store (`replay store:…`), the Azure export, per-request priority classes and the
per-run prompt seed. A hand-built DuckDB store (tests/diagnose/store.py) stands for a traced run;
the replay of a real run into a real store is tests/experiment/test_try_vllm.py's round trip."""

from __future__ import annotations

import dataclasses

import duckdb
import pytest

from tailtrace.cli import main
from tailtrace.loadgen.replay import ReplayConfig, build_plan, export_plan, prompt_seed
from tailtrace.loadgen.traces import load_trace
from tailtrace.plumbing.errors import UserError
from tests.diagnose.store import Req, write_store


def _runs_store(tmp_path):
    reqs = [Req(at=0.5 * i, prompt_tokens=100 + i, steps=[(10.0, 4, 0)] * (5 + i % 3), run_id="replay-a")
            for i in range(20)]
    reqs += [Req(at=30 + 0.25 * i, prompt_tokens=300 + i, steps=[(10.0, 4, 0)] * 9, run_id="replay-b")
             for i in range(12)]
    reqs += [Req(at=60 + 0.1 * i, prompt_tokens=50, steps=[(5.0, 4, 0)] * 3, run_id="capacity-probe-x")
             for i in range(8)]
    db = write_store(tmp_path / "s.duckdb", reqs)
    con = duckdb.connect(db)
    con.execute("UPDATE requests SET priority = CASE WHEN prompt_tokens % 2 = 0 THEN 'batch' ELSE 'interactive' END")
    con.close()
    return db


def test_store_run_gives_arrivals_lengths_and_classes(tmp_path):
    db = _runs_store(tmp_path)
    tr = load_trace(f"store:{db}#replay-a")
    assert tr.fmt == "store" and len(tr.requests) == 20
    assert [r.offset_s for r in tr.requests] == pytest.approx([0.5 * i for i in range(20)], abs=1e-6)
    assert [r.input_tokens for r in tr.requests] == [100 + i for i in range(20)]
    # no client span: the engine's output count (prefill's token + one per decode step)
    assert [r.output_tokens for r in tr.requests] == [6 + i % 3 for i in range(20)]
    assert [r.priority for r in tr.requests] == ["batch" if (100 + i) % 2 == 0 else "interactive" for i in range(20)]
    assert any("shared-prefix" in n for n in tr.notes)
    # no run named: the latest traffic run, never the probe that completed after it
    latest = load_trace(f"store:{db}")
    assert [r.input_tokens for r in latest.requests] == [300 + i for i in range(12)]
    assert latest.name.endswith("#replay-b")


def test_store_spec_errors_are_one_line(tmp_path):
    db = _runs_store(tmp_path)
    with pytest.raises(UserError, match="no run 'nope'.*replay-b"):
        load_trace(f"store:{db}#nope")
    with pytest.raises(UserError, match="store: needs a store"):
        load_trace("store:")
    with pytest.raises(UserError, match="give one"):
        load_trace(f"store:{db}", api="http://127.0.0.1:9")
    con = duckdb.connect(db)
    con.execute("UPDATE requests SET output_tokens = NULL WHERE run_id = 'replay-a'")
    con.close()
    with pytest.raises(UserError, match="no output token counts"):
        load_trace(f"store:{db}#replay-a")


def test_export_reads_back_exactly_with_classes(tmp_path):
    db = _runs_store(tmp_path)
    cfg = ReplayConfig(trace=f"store:{db}#replay-a", max_requests=15)
    path, n, _ = export_plan(cfg, tmp_path / "t.csv")
    assert n == 15
    head = path.read_text().splitlines()
    assert head[0] == "TIMESTAMP,ContextTokens,GeneratedTokens,priority"
    assert head[1].startswith("2025-10-09 08:00:00.0000000,100,")  # the run's own first arrival
    back = load_trace(str(path))
    plan, _ = build_plan(cfg)
    assert [(r.input_tokens, r.output_tokens, r.priority) for r in back.requests] == \
        [(p.input_tokens, p.output_tokens, p.priority) for p in plan]
    assert [r.offset_s for r in back.requests] == pytest.approx([p.offset_s for p in plan], abs=1e-6)
    # a shipped trace exports too (no priority column: the trace gives none) and reads back the same
    cfg = ReplayConfig(trace="azure-conv", duration_s=30, speed=4)
    path, n, _ = export_plan(cfg, tmp_path / "a.csv")
    plan, _ = build_plan(cfg)
    back = load_trace(str(path))
    assert path.read_text().splitlines()[0] == "TIMESTAMP,ContextTokens,GeneratedTokens"
    assert [r.offset_s for r in back.requests] == pytest.approx([p.offset_s for p in plan], abs=1e-6)
    assert [r.input_tokens for r in back.requests] == [p.input_tokens for p in plan]


def test_cli_export_sends_nothing_and_refuses_bad_input(tmp_path, capsys):
    db = _runs_store(tmp_path)
    out = tmp_path / "x.csv"
    # the target is a closed port: exporting never connects
    assert main(["replay", f"store:{db}#replay-b", "--target", "http://127.0.0.1:9",
                 "--export-trace", str(out)]) == 0
    assert "12 requests written" in capsys.readouterr().out
    assert len(out.read_text().splitlines()) == 13
    assert main(["replay", "azure-conv", "--api", "http://127.0.0.1:9", "--export-trace", str(out)]) == 2
    assert "--api reads a traced run" in capsys.readouterr().err
    assert main(["replay", f"store:{db}#replay-b", "--export-trace", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_priority_column_and_output_cap(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,priority\n"
                 "2024-01-01 00:00:00.0000000,10,500,batch\n"
                 "2024-01-01 00:00:01.0000000,20,30,\n"
                 "2024-01-01 00:00:02.0000000,30,700,interactive\n")
    plan, _ = build_plan(ReplayConfig(trace=str(p), priority="batch", max_output_tokens=64))
    assert [(x.priority, x.output_tokens) for x in plan] == [("batch", 64), ("batch", 30), ("interactive", 64)]
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,priority\n2024-01-01 00:00:00.0,10,5,urgent\n")
    with pytest.raises(UserError, match="line 2: priority must be interactive or batch"):
        load_trace(str(p))


def test_prompts_differ_between_runs_and_not_within_a_shared_prefix():
    cfg = ReplayConfig()
    a, b = prompt_seed(cfg, "try-1-b0"), prompt_seed(cfg, "try-1-b1")
    assert a != b and prompt_seed(cfg, "try-1-b0") == a
    assert prompt_seed(dataclasses.replace(cfg, prompt_seed=7), "any") == 7
    from tailtrace.loadgen.prompts import PromptBuilder

    pa, pb = PromptBuilder("m", seed=a), PromptBuilder("m", seed=b)
    # the same request index and hash id: different ids across runs, the same within one
    assert pa.prompt_text(0, 600, (5,)) != pb.prompt_text(0, 600, (5,))
    assert pa.prompt_text(0, 600, (5,))[:2000] == pa.prompt_text(9, 600, (5,))[:2000]


def test_export_never_overwrites_its_source_and_refuses_what_it_cannot_write(tmp_path, capsys):
    db = _runs_store(tmp_path)
    size = (tmp_path / "s.duckdb").stat().st_size
    assert main(["replay", f"store:{db}#replay-b", "--export-trace", db]) == 2
    assert "is the trace it reads" in capsys.readouterr().err
    other = tmp_path / "copy.duckdb"
    other.write_bytes((tmp_path / "s.duckdb").read_bytes())
    assert main(["replay", f"store:{db}#replay-b", "--export-trace", str(other)]) == 2
    assert "not a CSV file" in capsys.readouterr().err
    for bad in ("", " "):
        assert main(["replay", f"store:{db}#replay-b", "--target", "http://127.0.0.1:9", "--export-trace", bad]) == 2
        assert "--export-trace is empty" in capsys.readouterr().err
    assert main(["replay", f"store:{db}#replay-b", "--rate", "1e-300", "--export-trace", str(tmp_path / "x.csv")]) == 2
    assert "outside the years 1970..9999" in capsys.readouterr().err
    csv_in = tmp_path / "in.csv"
    csv_in.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00.0,10,5\n")
    assert main(["replay", str(csv_in), "--export-trace", str(csv_in)]) == 2
    assert "is the trace it reads" in capsys.readouterr().err
    assert csv_in.read_text().count("\n") == 2
    assert (tmp_path / "s.duckdb").stat().st_size == size and other.stat().st_size == size


def test_azure_rows_out_of_order_are_all_kept_and_bad_fractions_refused(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:05.0,10,5\n2024-01-01 00:00:01.5,20,6\n")
    tr = load_trace(str(p))
    assert [(r.offset_s, r.input_tokens) for r in tr.requests] == [(0.0, 20), (3.5, 10)]
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:05.-5,10,5\n")
    with pytest.raises(UserError, match="line 2: bad row"):
        load_trace(str(p))


def test_the_priority_column_is_read_whatever_its_case(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,Priority\n2024-01-01 00:00:00.0,10,5,Batch\n")
    assert load_trace(str(p)).requests[0].priority == "batch"
