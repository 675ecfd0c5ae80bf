"""Decision question sets built by construction, the same for the same seed.

- `order_set(n, seed)`: choice questions of 3 to 5 options about short texts (topics, people,
  places, numbers, sentiment, animals, weather), as `(input text, QuestionView)` pairs, for measuring
  how much an answer depends on the order of its options. Option counts cycle 3, 4, 5, so `n` a
  multiple of 3 holds as many of each. `order_set_answers(n, seed)` gives their right values.
- `labelled_set(n, seed)`: questions whose right answer is known by construction (number comparisons,
  a word's membership in a list, the sentiment of sentences built from clearly positive or negative
  words, the largest of 3 or 4 numbers, a word's category, the city a text names), half yes/no
  (predicate) and half choice questions, as `swama calibrate` DATA.jsonl records:
  `{"input": str, "question": <a /v1/decisions question object>, "answer": gold}`, where gold is
  true/false for a predicate and the option's value for a choice.
- `write_jsonl(records, path)` writes records one JSON object a line.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from swama.engine.client import QuestionView, decision_choice_view, predicate_view

OPTION_COUNTS = (3, 4, 5)

# ---------------------------------------------------------------------------------------------
# Vocabulary

NAMES = ("Maria", "James", "Aiko", "Omar", "Lena", "Ravi", "Sofia", "Tom", "Chen", "Amara", "Lukas", "Nadia")

TOPICS: dict[str, tuple[str, tuple[str, ...]]] = {
    # topic -> (description, sentences about it)
    "sports": ("games, athletes and competitions", (
        "The home team scored twice in the last ten minutes and won the cup final.",
        "She ran the marathon in under three hours and set a new club record.",
        "The coach changed the line-up before the second half of the match.")),
    "cooking": ("recipes, kitchens and food", (
        "Simmer the onions in butter, then add the rice and stir in the stock slowly.",
        "He bakes his bread with a sourdough starter and a very hot oven.",
        "The soup needs more salt and a handful of fresh basil before serving.")),
    "science": ("research, experiments and discoveries", (
        "The researchers measured the speed of the enzyme at five temperatures.",
        "A new telescope photographed a galaxy formed shortly after the big bang.",
        "The experiment was repeated three times to check the result.")),
    "music": ("songs, instruments and concerts", (
        "The band played their new album live for the first time on Friday night.",
        "She practises the violin every morning before school.",
        "The orchestra tuned their instruments while the audience took their seats.")),
    "politics": ("governments, elections and laws", (
        "The parliament voted on the new budget after a long debate.",
        "Both candidates promised lower taxes during the election campaign.",
        "The minister resigned after the report was published.")),
    "travel": ("trips, flights and holidays", (
        "We caught an early flight and spent the afternoon walking along the harbour.",
        "Their train through the mountains took nine hours with two changes.",
        "She booked a small hotel near the old town for the holidays.")),
    "finance": ("money, banks and markets", (
        "Shares fell sharply after the bank reported lower profits.",
        "He moved his savings into an account with a higher interest rate.",
        "The company borrowed money to pay for its new factory.")),
}

JOBS: dict[str, tuple[str, str]] = {
    # job -> (description, what the person does)
    "doctor": ("treats sick people", "spends the day examining patients and writing prescriptions at the clinic"),
    "teacher": ("teaches pupils", "marks homework every evening and explains fractions to a class of ten-year-olds"),
    "pilot": ("flies aircraft", "checks the weather before take-off and lands the plane at the airport"),
    "chef": ("cooks in a restaurant", "prepares sauces in the restaurant kitchen and plans the evening menu"),
    "farmer": ("grows crops or raises animals", "gets up at dawn to milk the cows and harvest the wheat"),
    "lawyer": ("gives legal advice", "prepares contracts and argues cases in court for clients"),
    "mechanic": ("repairs vehicles", "replaces brakes and changes the oil of cars in a small garage"),
}

PLACES: dict[str, tuple[str, str]] = {
    "beach": ("sand by the sea", "Waves rolled onto the warm sand while children built castles near the water."),
    "mountain": ("high rocky ground", "The path climbed above the tree line to a snowy summit with a view of the valleys."),
    "city": ("a large town", "Traffic filled the avenues between tall office towers and busy shops."),
    "forest": ("land covered with trees", "Tall pines stood close together and the ground was soft with needles and moss."),
    "desert": ("dry sandy land", "Nothing grew on the dunes, and the hot dry wind blew sand across the road."),
    "farm": ("fields and animals", "Cows grazed in the field next to the barn and the tractor stood by the hay."),
}

ANIMALS: dict[str, str] = {
    "dog": "It barked at the postman and wagged its tail when its owner came home.",
    "cat": "It purred on the sofa and chased a ball of wool across the floor.",
    "horse": "It galloped across the meadow and ate hay in its stable.",
    "fish": "It swam in circles around the tank and blew small bubbles.",
    "bird": "It sang on a branch at sunrise and flew off to build a nest.",
    "snake": "It slid silently through the grass and flicked its forked tongue.",
}

WEATHER: dict[str, str] = {
    "sunny": "There was not a cloud in the sky and everyone wore sunglasses.",
    "rainy": "It poured all day and the streets were full of puddles and umbrellas.",
    "snowy": "Thick flakes fell all night and the children built a snowman in the morning.",
    "windy": "Strong gusts bent the trees and blew hats off people's heads.",
    "foggy": "A thick grey mist hid the houses across the street all morning.",
}

POSITIVE_WORDS = ("wonderful", "excellent", "delightful", "fantastic", "superb", "lovely", "brilliant", "perfect")
NEGATIVE_WORDS = ("terrible", "awful", "horrible", "disgusting", "dreadful", "miserable", "useless", "appalling")
SUBJECTS = ("the hotel", "the meal", "the service", "the film", "the concert", "the new phone", "the trip",
            "the book", "the staff", "the room")
POSITIVE_TEMPLATES = ("I absolutely loved {s}; it was {w} and I would happily come back.",
                      "{S} was {w}, truly {w2}, and I enjoyed every minute.",
                      "What a {w} experience: {s} was {w2} and made me very happy.")
NEGATIVE_TEMPLATES = ("I hated {s}; it was {w} and I will never come back.",
                      "{S} was {w}, truly {w2}, and I regretted every minute.",
                      "What a {w} experience: {s} was {w2} and made me very angry.")

SENTIMENTS: dict[str, str] = {
    "positive": "favourable, happy",
    "negative": "unfavourable, unhappy",
    "neutral": "neither favourable nor unfavourable",
    "mixed": "both favourable and unfavourable",
    "sarcastic": "saying the opposite of what is meant",
}

LIST_WORDS = ("apples", "bread", "milk", "eggs", "cheese", "rice", "butter", "tomatoes", "onions", "coffee",
              "tea", "sugar", "pasta", "lemons", "carrots", "yogurt", "honey", "flour", "beans", "salt")

CATEGORIES: dict[str, tuple[str, ...]] = {
    "fruit": ("banana", "apple", "cherry", "mango", "pear", "peach", "grape", "plum"),
    "animal": ("tiger", "rabbit", "elephant", "wolf", "zebra", "monkey", "donkey", "camel"),
    "vehicle": ("bicycle", "truck", "tram", "scooter", "bus", "canoe", "tractor", "helicopter"),
    "colour": ("crimson", "turquoise", "violet", "orange", "indigo", "beige", "magenta", "scarlet"),
    "instrument": ("trumpet", "cello", "flute", "drum", "harp", "banjo", "piano", "clarinet"),
}

CITIES = ("Paris", "Tokyo", "Cairo", "Lima", "Oslo", "Toronto", "Sydney", "Nairobi", "Berlin", "Madrid", "Seoul",
          "Mumbai")


# ---------------------------------------------------------------------------------------------
# Order set: choice questions of 3 to 5 options


def _options(rng: random.Random, right: str, pool: dict[str, Any], count: int, describe: bool,
             detail: Any = None) -> list[tuple[str, str | None]]:
    """`count` options drawn from `pool`, `right` among them, shuffled; with a description each
    (`detail(key)`, by default the pool's value) when `describe`."""
    others = rng.sample([k for k in pool if k != right], count - 1)
    keys = [right, *others]
    rng.shuffle(keys)
    if detail is None:
        def detail(k: str) -> str:
            value = pool[k]
            return value[0] if isinstance(value, tuple) else value
    return [(k, detail(k) if describe else None) for k in keys]


def _topic(rng: random.Random, count: int, describe: bool) -> tuple[str, QuestionView, str]:
    topic = rng.choice(list(TOPICS))
    sentences = list(TOPICS[topic][1])
    rng.shuffle(sentences)
    text = " ".join(sentences[:2])
    return text, decision_choice_view("What is the main topic of this text?",
                                      _options(rng, topic, TOPICS, count, describe)), topic


def _job(rng: random.Random, count: int, describe: bool) -> tuple[str, QuestionView, str]:
    job = rng.choice(list(JOBS))
    name = rng.choice(NAMES)
    text = f"{name} {JOBS[job][1]}."
    return text, decision_choice_view(f"What is {name}'s job?", _options(rng, job, JOBS, count, describe)), job


def _place(rng: random.Random, count: int, describe: bool) -> tuple[str, QuestionView, str]:
    place = rng.choice(list(PLACES))
    name = rng.choice(NAMES)
    text = f"{name} wrote in a diary: \"{PLACES[place][1]}\""
    return text, decision_choice_view("What kind of place does the diary describe?",
                                      _options(rng, place, PLACES, count, describe)), place


def _animal(rng: random.Random, count: int, describe: bool) -> tuple[str, QuestionView, str]:
    animal = rng.choice(list(ANIMALS))
    return ANIMALS[animal], decision_choice_view(
        "Which animal is described?", _options(rng, animal, ANIMALS, count, describe, lambda k: f"a {k}")), animal


def _weather(rng: random.Random, count: int, describe: bool) -> tuple[str, QuestionView, str]:
    weather = rng.choice(list(WEATHER))
    text = f"Report from {rng.choice(CITIES)}: {WEATHER[weather]}"
    return text, decision_choice_view("What was the weather like?",
                                      _options(rng, weather, WEATHER, count, describe,
                                               lambda k: f"the weather was {k}")), weather


def _sentiment(rng: random.Random, count: int, describe: bool) -> tuple[str, QuestionView, str]:
    positive = rng.random() < 0.5
    text = _review(rng, positive)
    right = "positive" if positive else "negative"
    return text, decision_choice_view("What is the sentiment of this review?",
                                      _options(rng, right, SENTIMENTS, count, describe)), right


def _numbers(rng: random.Random, count: int, describe: bool) -> tuple[str, QuestionView, str]:
    values = rng.sample(range(2, 1000), count)
    what = rng.choice(("largest", "smallest"))
    name = rng.choice(NAMES)
    text = f"{name} counted the visitors on {count} days: " + ", ".join(str(v) for v in values) + "."
    labels = [(str(v), f"{v} visitors" if describe else None) for v in values]
    right = max(values) if what == "largest" else min(values)
    return text, decision_choice_view(f"Which count is the {what}?", labels), str(right)


ORDER_FAMILIES = (_topic, _job, _place, _animal, _weather, _sentiment, _numbers)


def _order_items(n: int, seed: int, option_counts: Sequence[int]) -> list[tuple[str, QuestionView, str]]:
    rng = random.Random(f"order-set/{seed}")
    items = []
    for i in range(n):
        family = ORDER_FAMILIES[i % len(ORDER_FAMILIES)]
        count = option_counts[i % len(option_counts)]
        describe = (i // len(ORDER_FAMILIES)) % 2 == 1
        items.append(family(rng, count, describe))
    return items


def order_set(n: int = 48, seed: int = 0, option_counts: Sequence[int] = OPTION_COUNTS,
              ) -> list[tuple[str, QuestionView]]:
    """`n` choice questions with their inputs; option counts cycle through `option_counts`, the
    families through topics, jobs, places, animals, weather, sentiment and numbers, and every
    second question of a family has option descriptions."""
    return [(text, view) for text, view, _ in _order_items(n, seed, option_counts)]


def order_set_answers(n: int = 48, seed: int = 0, option_counts: Sequence[int] = OPTION_COUNTS) -> list[str]:
    """The right option value of each `order_set(n, seed, option_counts)` question, by construction."""
    return [gold for _, _, gold in _order_items(n, seed, option_counts)]


# ---------------------------------------------------------------------------------------------
# Labelled set: gold answers by construction


def _review(rng: random.Random, positive: bool) -> str:
    words = POSITIVE_WORDS if positive else NEGATIVE_WORDS
    w, w2 = rng.sample(words, 2)
    s = rng.choice(SUBJECTS)
    template = rng.choice(POSITIVE_TEMPLATES if positive else NEGATIVE_TEMPLATES)
    return template.format(s=s, S=s[0].upper() + s[1:], w=w, w2=w2)


def _predicate(instructions: str) -> dict[str, Any]:
    return {"type": "predicate", "instructions": instructions}


def _choice(instructions: str, values: Sequence[str], descriptions: dict[str, str] | None = None,
            ) -> dict[str, Any]:
    choices = []
    for v in values:
        option: dict[str, Any] = {"value": v}
        if descriptions and descriptions.get(v):
            option["description"] = descriptions[v]
        choices.append(option)
    return {"type": "choice", "instructions": instructions, "choices": choices}


def _record(text: str, question: dict[str, Any], answer: bool | str) -> dict[str, Any]:
    return {"input": text, "question": question, "answer": answer}


def _compare_numbers(rng: random.Random) -> dict[str, Any]:
    a, b = rng.sample(range(1, 500), 2)
    item_a, item_b = rng.sample(("the lamp", "the chair", "the kettle", "the jacket", "the clock", "the bag"), 2)
    text = f"In the shop, {item_a} costs {a} dollars and {item_b} costs {b} dollars."
    if rng.random() < 0.5:
        return _record(text, _predicate(f"Does {item_a} cost more than {item_b}?"), a > b)
    return _record(text, _predicate(f"Is {item_a} cheaper than {item_b}?"), a < b)


def _membership(rng: random.Random) -> dict[str, Any]:
    listed = rng.sample(LIST_WORDS, 5)
    if rng.random() < 0.5:
        asked = rng.choice(listed)
    else:
        asked = rng.choice([w for w in LIST_WORDS if w not in listed])
    text = "Shopping list: " + ", ".join(listed) + "."
    return _record(text, _predicate(f"Is {asked} on the shopping list?"), asked in listed)


def _sentiment_predicate(rng: random.Random) -> dict[str, Any]:
    positive = rng.random() < 0.5
    text = _review(rng, positive)
    if rng.random() < 0.5:
        return _record(text, _predicate("Is this review positive?"), positive)
    return _record(text, _predicate("Is this review negative?"), not positive)


def _category_predicate(rng: random.Random) -> dict[str, Any]:
    category, other = rng.sample(list(CATEGORIES), 2)
    word = rng.choice(CATEGORIES[category if rng.random() < 0.5 else other])
    text = f"The word of the day is \"{word}\"."
    return _record(text, _predicate(f"Is the word of the day a kind of {category}?"), word in CATEGORIES[category])


def _largest(rng: random.Random) -> dict[str, Any]:
    count = rng.choice((3, 4))
    values = rng.sample(range(1, 100), count)
    text = "The numbers are " + ", ".join(str(v) for v in values) + "."
    shown = [str(v) for v in rng.sample(values, count)]
    return _record(text, _choice("Which of these numbers is the largest?", shown), str(max(values)))


def _sentiment_choice(rng: random.Random) -> dict[str, Any]:
    positive = rng.random() < 0.5
    text = _review(rng, positive)
    values = rng.sample(["positive", "negative", "neutral"], 3)
    descriptions = SENTIMENTS if rng.random() < 0.5 else None
    return _record(text, _choice("What is the sentiment of this review?", values, descriptions),
                   "positive" if positive else "negative")


def _category_choice(rng: random.Random) -> dict[str, Any]:
    count = rng.choice((3, 4))
    categories = rng.sample(list(CATEGORIES), count)
    right = categories[0]
    word = rng.choice(CATEGORIES[right])
    rng.shuffle(categories)
    text = f"The word of the day is \"{word}\"."
    return _record(text, _choice("What kind of thing is the word of the day?", categories), right)


def _city_choice(rng: random.Random) -> dict[str, Any]:
    count = rng.choice((3, 4))
    cities = rng.sample(CITIES, count)
    right = cities[0]
    rng.shuffle(cities)
    name = rng.choice(NAMES)
    text = f"{name} flew to {right} last week for a conference and came back on Sunday."
    return _record(text, _choice(f"Which city did {name} visit?", cities), right)


PREDICATE_FAMILIES = (_compare_numbers, _membership, _sentiment_predicate, _category_predicate)
CHOICE_FAMILIES = (_largest, _sentiment_choice, _category_choice, _city_choice)


def labelled_set(n: int = 200, seed: int = 0) -> list[dict[str, Any]]:
    """`n` labelled records, predicate and choice questions alternating, each family in turn."""
    rng = random.Random(f"labelled-set/{seed}")
    records = []
    for i in range(n):
        families = PREDICATE_FAMILIES if i % 2 == 0 else CHOICE_FAMILIES
        records.append(families[(i // 2) % len(families)](rng))
    return records


def write_jsonl(records: Iterable[dict[str, Any]], path: Path) -> Path:
    """`records` one JSON object a line (a `swama calibrate` DATA.jsonl)."""
    path = Path(path)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def question_view(question: dict[str, Any]) -> QuestionView:
    """The view of a labelled record's question (predicate or choice)."""
    if question["type"] == "predicate":
        return predicate_view(question["instructions"])
    return decision_choice_view(question["instructions"],
                                [(c["value"], c.get("description") or None) for c in question["choices"]])
