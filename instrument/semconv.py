"""tailtrace's semantic conventions, re-exported: they live in `semantics.semconv` (the catalog
at the bottom of the house, which every part imports and which imports no part)."""

from tailtrace.semantics.semconv import *
