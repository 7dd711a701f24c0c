"""Knowledge transfer from the foundation model (FM) into per-surface students (the `distill` stage).

    signals.py   what the FM logged (gold.fm_predictions, gold.fm_history_codes), attached to batches
    leakage.py   the rule that no FM output a student reads for day D comes from a model trained on D or later
    data.py      a surface's examples of given days as a loader manifest, streamed with the FM's signals
    run.py       the stage: train each surface's student, score it and the FM on the held-out day, promote
"""
