"""A fleet of simulated sensors publishing readings to Kittiwake over MQTT at QoS 1.

Each device publishes ``sensors/<device>/reading`` with a JSON payload
``{"device": "dev-007", "ts": <epoch ms>, "temperature": 21.4, "humidity": 48.0}`` about once
per ``--interval`` seconds; now and then a device overheats (a spike well above its normal
range), which the pipeline reports as an alert. The devices share a few MQTT connections, as
devices behind gateways do.

    python examples/sensor_simulator.py --port 1883 --devices 300 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from dataclasses import dataclass

import paho.mqtt.client as mqtt

# How often a reading is a spike (an overheating device), and how far above normal it goes.
SPIKE_PROBABILITY = 0.003
SPIKE = 25.0


@dataclass
class Device:
    name: str
    baseline: float
    temperature: float
    humidity: float

    def reading(self, rng: random.Random) -> dict[str, object]:
        # A slow random walk around the device's baseline, and the odd spike.
        self.temperature += rng.gauss(0, 0.2) + (self.baseline - self.temperature) * 0.05
        self.humidity = min(100.0, max(0.0, self.humidity + rng.gauss(0, 0.5)))
        temperature = self.temperature + (SPIKE if rng.random() < SPIKE_PROBABILITY else 0.0)
        return {
            "device": self.name,
            "ts": int(time.time() * 1000),
            "temperature": round(temperature, 2),
            "humidity": round(self.humidity, 1),
        }


class Simulator:
    """Publishes a reading per device per ``interval`` until :meth:`stop`; counts what the
    broker acknowledged."""

    def __init__(
        self,
        host: str,
        port: int,
        devices: int = 300,
        interval: float = 1.0,
        connections: int = 4,
        seed: int = 7,
    ) -> None:
        self.interval = interval
        rng = random.Random(seed)
        self.devices = [
            Device(f"dev-{i:03d}", baseline, baseline, rng.uniform(30, 60))
            for i, baseline in enumerate(rng.uniform(18, 26) for _ in range(devices))
        ]
        self._rng = rng
        self._clients = []
        for n in range(connections):
            client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"gateway-{n}")
            client.max_inflight_messages_set(200)
            client.on_publish = self._acknowledged
            client.connect(host, port)
            client.loop_start()
            self._clients.append(client)
        self.published = 0
        self.acknowledged = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="simulator", daemon=True)

    def _acknowledged(self, client, userdata, mid, reason_code, properties) -> None:  # type: ignore[no-untyped-def]
        with self._lock:
            self.acknowledged += 1

    def start(self) -> Simulator:
        self._thread.start()
        return self

    def _run(self) -> None:
        next_round = time.monotonic()
        while not self._stop.is_set():
            for i, device in enumerate(self.devices):
                client = self._clients[i % len(self._clients)]
                payload = json.dumps(device.reading(self._rng))
                client.publish(f"sensors/{device.name}/reading", payload, qos=1)
                self.published += 1
            next_round += self.interval
            self._stop.wait(max(0.0, next_round - time.monotonic()))

    def stop(self, timeout: float = 10.0) -> None:
        """Stop publishing, and disconnect once the broker acknowledged everything published
        (or ``timeout`` passed), so ``acknowledged`` counts every reading the broker took."""
        self._stop.set()
        self._thread.join(10)
        deadline = time.monotonic() + timeout
        while self.acknowledged < self.published and time.monotonic() < deadline:
            time.sleep(0.05)
        for client in self._clients:
            client.disconnect()
            client.loop_stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--devices", type=int, default=300)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    simulator = Simulator(args.host, args.port, args.devices, args.interval).start()
    deadline = time.monotonic() + args.seconds
    try:
        while time.monotonic() < deadline:
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
            print(f"published {simulator.published}, acknowledged {simulator.acknowledged}")
    finally:
        simulator.stop()


if __name__ == "__main__":
    main()
