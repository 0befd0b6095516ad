"""Every span name, phase and attribute key in instrument/semconv.py is documented in docs/semconv.md."""

from pathlib import Path

from tailtrace.instrument import semconv


def test_every_semconv_name_is_documented():
    doc = (Path(__file__).parent.parent / "docs" / "semconv.md").read_text()
    names = {k: v for k, v in vars(semconv).items() if k.isupper() and isinstance(v, str)}
    assert len(names) > 60
    missing = sorted(f"{k}={v}" for k, v in names.items() if f"`{v}" not in doc)
    assert not missing, f"undocumented in docs/semconv.md: {missing}"
