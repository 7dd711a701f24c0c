"""The lakehouse side of the pipeline: the Spark session, Delta tables, landing files, completion
records, the stage registry and the one commit path every stage goes through.

Imported by the DAG processor (through gem.lakehouse.stages): this file stays import-free.
"""
