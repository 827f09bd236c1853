"""Kittiwake's benchmark harness: a raw-socket MQTT 3.1.1 load generator, peer brokers
(mosquitto, amqtt) started on loopback ports, and the workloads run against each of them.

Entry point: ``bench/run.py``. Nothing here imports kittiwake: the load generator speaks
MQTT 3.1.1 bytes it encodes itself, identically to every broker.
"""
