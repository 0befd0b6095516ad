"""plumbing: the bottom floor's helpers every part uses (beside `semantics`, the catalog).

- `plumbing.errors`: `UserError`, the one exception a command turns into one line and exit 2;
- `plumbing.urls`: base URLs checked and normalised;
- `plumbing.http_body`: request bodies read with size and time limits;
- `plumbing.procs`: processes started in their own group, waited for, stopped (never by name);
- `plumbing.argtypes`: argparse types shared by the CLIs.

It imports no other part of tailtrace.
"""
