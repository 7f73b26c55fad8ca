"""The record the trace reader keeps of a PyTorch CPU op: its name and the inputs Kineto recorded with it, as one text
(op_record), and that text read back (op_from_record) by the cost model that counts the op's work
(xdiag.cost.torch_ops). The reader records; it never costs.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

_RECORDED_INPUTS = ("Input Dims", "Input type", "Concrete Inputs")
"""What Kineto records of a CPU op's inputs with record_shapes=True: all that its FLOPs and bytes are counted from."""


def _plain_number(value: Any) -> int | float:
    """A number ijson read as Decimal, as JSON writes it: exactly where it is whole."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def op_record(name: str, args: dict) -> str:
    """A CPU op's name and its recorded inputs (`Input Dims`, `Input type`, `Concrete Inputs`, those it has) as one
    text; its name alone where it carries no `Input Dims` (a trace recorded with record_shapes=False)."""
    if "Input Dims" not in args:
        return json.dumps([name])
    inputs = {key: args[key] for key in _RECORDED_INPUTS if key in args}
    return json.dumps([name, inputs], separators=(",", ":"), default=_plain_number)


def op_from_record(record: str) -> tuple[str, dict]:
    """(name, recorded inputs as the trace's args hold them) of an op_record."""
    name, *inputs = json.loads(record)
    return name, inputs[0] if inputs else {}
