"""What `tailtrace explain` answers, as plain data: the tail set, its excess split by phase, the
ranked findings, the capacity line. `Report.to_dict()` is the JSON of docs/explain.schema.json;
the renderers (diagnose/render.py) and the dashboard read these dataclasses, never the SQL."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["CONFIDENCES", "DOMINANT_MIN_SHARE", "SCHEMA_ID", "Capacity", "Evidence", "Finding", "PhaseShare",
           "Report", "TailSet", "TraceReport"]

SCHEMA_ID = "tailtrace.explain/2"
CONFIDENCES = ("high", "medium", "low")
# A finding is called dominant when it ranks first, explains at least this share of the tail's
# excess and has high or medium confidence (docs/explain.md).
DOMINANT_MIN_SHARE = 0.25


@dataclass
class Evidence:
    """One query behind a finding: `what` it shows, its `numbers` (name -> value; ms, tokens,
    fractions as their names say), and the `sql` with its positional `params` exactly as run, so
    `tailtrace sql` or `/api/sql` can re-run it."""

    what: str
    numbers: dict
    sql: str
    params: list


@dataclass
class Finding:
    """One cause of the tail. `layer`/`layer_label`: the catalog's layer; `cause`: a stable key
    (e.g. `engine_queue_burst`); `title`/`summary`: words for people; `phase`: the `requests`
    column it acts through (None: several or none); `share`: the fraction of the tail's total
    excess it explains (not added across findings; 0..1); `explained_ms`: that excess in ms;
    `score`: what ranks it (the share, or for errors the share of misses); `confidence`: one of
    CONFIDENCES; `mitigations`: one or two suggestions; `example_trace_ids`: tail requests it
    speaks of; `window`: {"start", "end"} ISO UTC of those requests; `actions`: one to three
    changes to try (diagnose/actions.py: knob, where, current, proposed, expected, rationale);
    `expected_behaviour`: the finding is what every deployment shows (long answers make a long
    E2E) rather than a fault: reported after the missed objectives, never as the headline."""

    layer: str
    layer_label: str
    cause: str
    title: str
    summary: str
    share: float
    explained_ms: float
    confidence: str
    evidence: list[Evidence]
    mitigations: list[str]
    example_trace_ids: list[str]
    window: dict
    phase: str | None = None
    score: float | None = None
    rank: int = 0
    dominant: bool = False
    actions: list = field(default_factory=list)
    expected_behaviour: bool = False

    def rank_key(self) -> float:
        """What ranks findings: the share (or `score`) times the confidence's weight (1, 0.75, 0.4)."""
        weight = {"high": 1.0, "medium": 0.75, "low": 0.4}[self.confidence]
        return (self.share if self.score is None else self.score) * weight


@dataclass
class PhaseShare:
    """One phase's part of the tail's excess: `column` of `requests` (or `rest_of_ttft`), `label`,
    its catalog `layer` key; `median_ms` its part of the median's latency (the median split in the
    proportions of the requests between P40 and P60), `tail_mean_ms` its mean over the tail,
    `excess_ms` the tail's summed excess in it, `share` of the total (the shares add up to 1; a
    phase the tail spends less in than the median has a negative share), `holds_most` the number of
    tail requests whose largest excess is this phase; `measured` False when no request of the scope
    measured it (its layer was not traced: shown "not measured (`why`)", never 0 ms)."""

    column: str
    label: str
    layer: str
    median_ms: float
    tail_mean_ms: float
    excess_ms: float
    share: float
    holds_most: int
    measured: bool = True
    why: str | None = None


@dataclass
class TailSet:
    """The requests explained: `metric` and its `column`, the `ok` requests of the scope that have
    it (`n`), their exact median and the tail's threshold, their exact `quantile` (ms,
    quantile_cont; `label` P99 for 0.99), the tail (strictly above the threshold: `n_tail`) and its
    total excess over the median (`excess_ms`). `window`: the scope's [start, end) as ISO UTC;
    `where`/`params`: the SQL condition on `requests` selecting the population (the tail adds
    `AND <column> > threshold`), in DuckDB's dialect, as the detectors run it; `shown`: the tail's
    (condition, params) as the report shows them when the store speaks another dialect
    (source.evidence_for_store: ClickHouse's, params bound), else None (`tail_where`, `tail_params`)."""

    metric: str
    column: str
    n: int
    median_ms: float
    quantile: float
    threshold_ms: float
    n_tail: int
    excess_ms: float
    window: dict
    where: str
    params: list
    shown: tuple[str, list] | None = None

    @property
    def tail_where(self) -> str:
        """The SQL condition on `requests` selecting the tail (its parameters: `tail_params`)."""
        return f"{self.where} AND {self.column} > ?"

    @property
    def tail_params(self) -> list:
        """The parameters of `tail_where`: the population's, then the threshold."""
        return [*self.params, self.threshold_ms]

    @property
    def label(self) -> str:
        """The tail's quantile as the field writes it: P99, P999, P90."""
        from tailtrace.semantics.catalog import quantile_label

        return quantile_label(self.quantile)


@dataclass
class Capacity:
    """The capacity line: `kind` 'sweep' (the store holds several rates of one sweep), 'probe' (a
    capacity probe's rates applied to the scope's mix) or 'steady';
    `text` the sentence; `numbers` what it rests on; `evidence` its query."""

    kind: str
    text: str
    numbers: dict
    evidence: list[Evidence] = field(default_factory=list)


@dataclass
class TraceReport:
    """One request (`--trace-id`): its phases in the order it lived them [{column, label, layer,
    start_ms, ms}] (start relative to its arrival), its decode steps' batch company, and its cause."""

    trace_id: str
    request: dict
    phases: list[dict]
    steps: dict
    cause: dict
    evidence: list[Evidence]


@dataclass
class Report:
    """The whole answer: the scope, the tail set, the phase split (adds up to 1), the layers'
    shares (their phases' sum), the ranked findings, the capacity line, notes on what the store
    could not tell, and for `--trace-id` the one request; the objectives' verdicts over the scope
    (`objectives`), the reports of the other missed objectives (`also`, objectives first) and the
    recorded configuration the actions read (`deployment`)."""

    scope: dict
    tail: TailSet | None
    phases: list[PhaseShare]
    layers: list[dict]
    findings: list[Finding]
    capacity: Capacity | None
    notes: list[str]
    trace: TraceReport | None = None
    objectives: list = field(default_factory=list)   # diagnose.objectives.Verdict, worst ratio first
    also: list = field(default_factory=list)         # Reports of the other missed objectives, in order
    deployment: dict | None = None                   # collector.query.deployment.Deployment.to_dict()

    def to_dict(self) -> dict:
        """The report as JSON values, following docs/explain.schema.json."""
        tail = None
        if self.tail is not None:
            tail = {k: v for k, v in asdict(self.tail).items() if k not in ("where", "params", "shown")}
            tail["label"] = self.tail.label
            tail["sql_where"], tail["sql_params"] = self.tail.shown or (self.tail.tail_where, self.tail.tail_params)
        return {
            "schema": SCHEMA_ID,
            "scope": self.scope,
            "objectives": [v.to_dict() for v in self.objectives],
            "tail": tail,
            "phases": [asdict(p) for p in self.phases],
            "layers": self.layers,
            "findings": [asdict(f) for f in self.findings],
            "capacity": asdict(self.capacity) if self.capacity else None,
            "notes": list(self.notes),
            "trace": asdict(self.trace) if self.trace else None,
            "deployment": self.deployment,
            "also": [r.to_dict() for r in self.also],
        }
