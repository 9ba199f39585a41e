"""Reads TensorBoard event files back without TensorFlow or tensorboard: the TFRecord framing
(length uint64, its masked CRC32C, the bytes, their masked CRC32C; little-endian) around
``Event`` protobufs, parsed with the protobuf classes tensorboardX ships."""

import os
import struct
from typing import Iterator

from tensorboardX.proto.event_pb2 import Event


def read_events(folder: str) -> Iterator[Event]:
  """Every Event in the ``events.out.tfevents*`` files under ``folder`` (file order by name)."""
  for root, _, files in sorted(os.walk(folder)):
    for name in sorted(f for f in files if f.startswith("events.out.tfevents")):
      with open(os.path.join(root, name), "rb") as f:
        data = f.read()
      at = 0
      while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        at += 12  # the length and its CRC
        event = Event()
        event.ParseFromString(data[at:at + length])
        at += length + 4  # the bytes and their CRC
        yield event
