"""`tailtrace simulate`: a step-time model fitted to a deployment's own engine steps (fit.py, model.py),
vLLM's v1 scheduler as a discrete-event model (engine.py) behind tailtrace's gateway over N replicas
(cluster.py), what it prints (report.py, render.py), capacity at the SLO (capacity.py) and simulated
runs written as a store (store.py). docs/simulate.md."""
