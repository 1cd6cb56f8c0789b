"""Frozen dataclasses built on the hot path without their generated ``__init__``.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (its own
``__setattr__`` refuses): a call per field, about six times a plain slotted class's
assignments. A worker builds a few such records per message (the store's Delivery, the
public Message, the handler's Outcome), so ``quick(cls)`` returns a class of the same slots
whose ``__init__`` assigns the fields plainly and then makes the instance a ``cls``
(``__class__`` assignment, which Python allows between classes of the same layout). What
it returns is a ``cls`` in every way: frozen, equal to and hashed as one built by
``cls(...)``, with ``dataclasses.replace``, ``fields`` and pickling as before.
"""

import dataclasses
from typing import Any, TypeVar, cast

T = TypeVar("T")


def quick(cls: type[T]) -> type[T]:
    """A builder of ``cls`` (a frozen, slotted dataclass with no ``__post_init__`` and no
    default factories), called as ``cls`` is, positionally or by keyword."""
    if not (dataclasses.is_dataclass(cls) and hasattr(cls, "__slots__")):
        raise TypeError(f"{cls.__name__} is not a slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__, which quick() would skip")
    fields = dataclasses.fields(cls)
    if not all(field.init for field in fields):
        raise TypeError(f"{cls.__name__} has a field outside __init__, which quick() skips")
    if any(field.default_factory is not dataclasses.MISSING for field in fields):
        raise TypeError(f"{cls.__name__} has a default factory, which quick() does not make")
    missing = dataclasses.MISSING
    defaults = {f"_default_{f.name}": f.default for f in fields if f.default is not missing}
    parameters = ", ".join(
        f.name if f.default is dataclasses.MISSING else f"{f.name}=_default_{f.name}"
        for f in fields
    )
    body = "".join(f"    self.{f.name} = {f.name}\n" for f in fields)
    source = f"def __init__(self, {parameters}):\n{body}    self.__class__ = _cls\n"
    namespace: dict[str, Any] = {"_cls": cls, **defaults}
    exec(source, namespace)  # our own text, from the dataclass's field names
    builder = type(
        f"_Quick{cls.__name__}",
        (),
        {"__slots__": vars(cls)["__slots__"], "__init__": namespace["__init__"]},
    )
    # Fails here, at import, if the layouts differ (a base class with slots of its own).
    builder(*(None for f in fields if f.default is dataclasses.MISSING))
    return cast(type[T], builder)
