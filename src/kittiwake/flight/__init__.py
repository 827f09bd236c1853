"""The Arrow Flight front end: range reads of the journal for Spark executors over the network.

Needs the ``flight`` extra (pyarrow); nothing outside this package and ``kittiwake.spark``
imports pyarrow, so a broker without a flight listener runs without it.
"""
