"""JSON schemas of the shapes structured-output users send, each with a prompt that asks for it.

Strings and arrays carry bounds where a model with random weights would otherwise write forever; the
shapes cover nested objects, arrays with min/max items, enums, anyOf, $ref/$defs, string formats and
patterns, numbers with bounds, required and optional fields and additionalProperties: false.
"""

from __future__ import annotations

from typing import Any

NAME = {"type": "string", "minLength": 1, "maxLength": 24}
SHORT = {"type": "string", "maxLength": 40}


def obj(properties: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties) if required is None else required,
            "additionalProperties": False, **extra}


SCHEMAS: list[tuple[str, dict[str, Any], str]] = [
    ("person", obj({"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
     "Describe a person with a name and an age."),
    ("city", obj({"city": NAME, "country": NAME, "population": {"type": "integer", "minimum": 0}}),
     "Tell me about Paris: city, country and population."),
    ("boolean flag", obj({"answer": {"type": "boolean"}}), "Is the sky blue? Answer as JSON."),
    ("enum color", obj({"color": {"enum": ["red", "green", "blue"]}}), "Pick a color."),
    ("enum mixed", obj({"value": {"enum": ["low", 1, True, None]}}), "Pick a value."),
    ("const", obj({"kind": {"const": "fruit"}, "name": NAME}), "Name a fruit."),
    ("number bounds", obj({"temperature": {"type": "number", "minimum": -50, "maximum": 60}}),
     "What is the temperature in Paris today?"),
    ("exclusive bounds", obj({"ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}}),
     "Give a ratio between zero and one."),
    ("integer range", obj({"dice": {"type": "integer", "minimum": 1, "maximum": 6}}), "Roll a die."),
    ("array of strings", obj({"tags": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 4}}),
     "Give tags for a blog post about cooking."),
    ("array bounds", obj({"primes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100},
                                     "minItems": 3, "maxItems": 3}}), "List three prime numbers."),
    ("array of objects", obj({"items": {"type": "array", "maxItems": 3, "items": obj({"sku": NAME,
                                                                                    "qty": {"type": "integer",
                                                                                            "minimum": 1,
                                                                                            "maximum": 9}})}}),
     "Make a shopping list."),
    ("nested object", obj({"user": obj({"name": NAME, "address": obj({"street": SHORT, "city": NAME})})}),
     "Describe a user and their address."),
    ("deep nesting", obj({"a": obj({"b": obj({"c": obj({"d": {"type": "integer", "minimum": 0, "maximum": 9}})})})}),
     "Fill in a nested structure."),
    ("optional fields", obj({"title": NAME, "subtitle": SHORT, "pages": {"type": "integer", "minimum": 1,
                                                                         "maximum": 2000}}, required=["title"]),
     "Describe a book."),
    ("anyOf", obj({"id": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 10**6}, NAME]}}),
     "Give an identifier."),
    ("nullable", obj({"middle_name": {"anyOf": [NAME, {"type": "null"}]}, "first": NAME}),
     "Give a first name and a middle name if any."),
    ("type list", obj({"value": {"type": ["integer", "null"], "minimum": 0, "maximum": 99}}), "Give a small number."),
    ("ref defs", {"$defs": {"point": obj({"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                          "y": {"type": "integer", "minimum": -9, "maximum": 9}})},
                  **obj({"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}})},
     "Give a line segment with start and end points."),
    ("ref in array", {"$defs": {"step": obj({"n": {"type": "integer", "minimum": 1, "maximum": 9}, "text": SHORT})},
                      **obj({"steps": {"type": "array", "items": {"$ref": "#/$defs/step"}, "minItems": 1,
                                       "maxItems": 3}})},
     "Give a recipe's steps."),
    ("pattern", obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}}), "Give a product code."),
    ("pattern phone", obj({"phone": {"type": "string", "pattern": "^\\+[0-9]{2} [0-9]{3} [0-9]{4}$"}}),
     "Give a phone number."),
    ("format email", obj({"email": {"type": "string", "format": "email", "maxLength": 40}}),
     "Give an email address for Ada."),
    ("format date", obj({"date": {"type": "string", "format": "date"}}), "When did the moon landing happen?"),
    ("format date-time", obj({"at": {"type": "string", "format": "date-time"}}), "When is the meeting?"),
    ("format uuid", obj({"id": {"type": "string", "format": "uuid"}}), "Make up an identifier."),
    ("format ipv4", obj({"ip": {"type": "string", "format": "ipv4"}}), "Give a local IP address."),
    ("string length", obj({"word": {"type": "string", "minLength": 3, "maxLength": 8}}), "Give a word."),
    ("top-level array", {"type": "array", "items": NAME, "minItems": 2, "maxItems": 3}, "List some animals."),
    ("top-level enum", {"enum": ["yes", "no"]}, "Is water wet?"),
    ("top-level integer", {"type": "integer", "minimum": 0, "maximum": 1000}, "How many legs does a spider have?"),
    ("map of numbers", {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 99},
                        "maxProperties": 3}, "Count fruits in a basket."),
    ("allOf", {"allOf": [obj({"a": {"type": "integer", "minimum": 0, "maximum": 9}}, required=["a"]),
                         {"required": ["a"]}]}, "Give a digit as a."),
    ("event", obj({"name": NAME, "date": {"type": "string", "format": "date"},
                   "attendees": {"type": "array", "items": obj({"name": NAME, "email": {"type": "string",
                                                                                       "format": "email",
                                                                                       "maxLength": 40}}),
                                 "maxItems": 2},
                   "status": {"enum": ["planned", "done"]}}, required=["name", "date", "status"]),
     "Plan a team lunch."),
]
