"""Serving a promoted student: its artifact (ONNX graph, feature spec, lineage) and the scorer.

    export.py    a trained student -> an artifact folder (the distill stage calls it per promoted student)
    features.py  the feature spec, and feature rows -> the graph's input arrays (numpy and pyarrow only)
    score.py     `gem score`: an artifact over a Parquet file or a Delta table's day, with onnxruntime;
                 it imports neither the training code (gem.train, gem.model, gem.distill), torch nor Spark
"""
