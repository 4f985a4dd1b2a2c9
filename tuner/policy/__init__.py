"""The search's rules, as pure functions and records: what is searched, what a trial left, what is recommended.

No processes, no storage, no TensorFlow: the study loop, the backends and the search call them.

    knobs.py       the knob table: what the tuner searches, records and shows, read from `LMSConfig`'s fields
    space.py       the search space: the knob table's searched fields, ``n_tensors`` scaled to the graph
    goal.py        what a study maximises: the largest batch, or the throughput at a fixed batch (``--batch N``)
    batch.py       the largest batch that fits a memory budget: predicted, or grown then bisected on measurements
    bracket.py     the bracket of fresh processes as arithmetic: the next batch to run, what the runs say
    records.py     trial records: what one evaluated config left in the study (user attrs, trials.csv columns)
    pareto.py      Pareto dominance, once: the fronts the recommendation, the screening picks and the report use
    selection.py   which trial is recommended: the feasible trials, their front, the rule's pick, the baseline
"""
