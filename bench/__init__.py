"""Side-by-side benchmarks of VOX against a raw MQTT baseline on the same broker (`make bench`).

One module per figure, each with `run(workdir, quick)` returning its rows (see __main__).
"""
