"""Trial workers, the parent's side: TensorFlow runs in worker processes, never in the search's own.

A worker runs ``python -m tuner.trial`` (the worker's program, at tuner/'s root with the zygote's,
`tuner.zygote_server`, because it imports the backends that start workers from here); this package
starts, follows and stops it, and holds what both sides share.

    run.py         start a worker, follow it, stop it, read its result (`run_worker`)
    protocol.py    the typed, versioned requests and results both sides exchange, as JSON
    zygote.py      fresh worker processes without a fresh TensorFlow import: forked from one that imported it
    gpus.py        which GPU a worker runs on, and the environment it runs in (pure functions, no NVML)
    oom.py         what ran out when TensorFlow raised ``ResourceExhaustedError``: device or pinned host memory
    programs.py    the user's own program in a trial (``model.fit`` or their step), run on the worker's side
    faults.py      TEST-ONLY fault injection into workers (``FAULT_ENV``), read by both sides of the protocol
"""
