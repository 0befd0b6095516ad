"""semantics: the catalog (phases, layers, statuses, quantiles, SLO defaults, derived quantities)
and the semantic conventions (span names, attribute keys). Imported by every part; imports none."""
