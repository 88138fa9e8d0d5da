from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Record(BaseModel):
    """Base of every wire record: unknown fields are ignored so old clients
    keep working against newer servers, and names populate by field name."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")


def _unknown(cls: type[BaseModel], data: dict, at: tuple = ()) -> list[tuple]:
    """Where ``data`` names a field ``cls`` does not have, a record it holds given as a dict
    included (``capacity={"cpu": 4}``)."""
    out = []
    for key, value in data.items():
        field = cls.model_fields.get(key) or next((f for f in cls.model_fields.values() if f.alias == key), None)
        if field is None:
            out.append(at + (key,))
        elif isinstance(value, dict) and isinstance(field.annotation, type) and issubclass(field.annotation, Asked):
            out += _unknown(field.annotation, value, at + (key,))
    return out


class Asked(Record):
    """A record a caller builds to send (a request, a declared capacity): an unknown keyword
    is refused as it is made (``regoin=`` or ``cpu=`` registered a host with none of it, where
    the REST API refuses the same body). Answers read with ``model_validate`` still ignore
    fields a newer server adds."""

    def __init__(self, **data):
        if bad := _unknown(type(self), data):
            from pydantic import ValidationError
            raise ValidationError.from_exception_data(type(self).__name__, [
                {"type": "extra_forbidden", "loc": loc, "input": _at(data, loc)} for loc in bad])
        super().__init__(**data)

    # (pydantic calls a model's own ``__init__`` from ``model_validate`` too, unless it is marked
    # as the base one: answers and stored rows are read without this check)
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


def _at(data: dict, loc: tuple):
    for key in loc:
        data = data[key]
    return data
