"""The study: where a search's trials live, how they are asked for and told, and what a search is given.

Optuna is met here (and in the search's top level, `tuner.search`); the rules it applies are `tuner.policy`'s.

    settings.py    `SearchSettings`: everything a search needs, validated once by the CLI (or a test, a benchmark)
    record.py      `StudyRecord`: the settings a search stores with its study, typed, as `best` and the report read them
    storage.py     where studies live: study names, storage URLs, opening them without leaking secrets
    masking.py     secrets in storage URLs, masked by rule wherever a URL or a message may show them
    study.py       the Optuna studies of a search: objectives, samplers, claiming a study, its warm start
    recovery.py    trials left RUNNING by a process that is gone, and heartbeats (the one module on Optuna's privates)
    loop.py        the ask/tell loop: one study, a search space, an evaluation function, until enough configs ran
    progress.py    progress on stderr: one bar across the whole search, and the log lines below it
"""
